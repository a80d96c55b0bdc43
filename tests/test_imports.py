"""The package's import graph, read from the source (ast), without importing anything.

The rule (issue #11):
1. No cycles among `pipeline` modules, counting imports inside functions as edges too: a
   function-level import cannot hide a cycle that moving it to the top would create.
2. A function-level import of a `pipeline` module is allowed only when it keeps a heavy
   third-party module (`HEAVY`: torch, transformers, ray, ...) off the importing module's
   start-up path, i.e. the imported module reaches a heavy module through its top-level imports
   and the importing module does not. Anything else belongs at the top of the file.
Importing a package's submodule runs the package's `__init__` first; that implicit edge is not
counted (a package `__init__` re-exporting its submodules is the usual layout).
3. The folders show the architecture (issue #32): modules live in subpackages (at most two beside
   `pipeline/__init__.py`); no module imports from the package root `pipeline` (the top floor,
   which re-exports the public names), and none names a module path from before the layout
   (`pipeline.MOVED`, served only as deprecated aliases for users).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
ROOT = PROJECT / "pipeline"
# third-party modules slow enough to import that the package defers them where it can
HEAVY = {"torch", "transformers", "ray", "safetensors", "pyarrow", "wandb", "datasets", "math_verify",
         "matplotlib", "sglang", "openai", "httpx", "aiohttp"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The `pipeline` module a dotted import name lands in (None: not a pipeline module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported name, line, at top level) of every absolute import in `module`."""
    tree = ast.parse(MODULES[module].read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                # `from pkg import sub` imports the submodule pkg.sub when there is one
                full = f"{node.module}.{alias.name}"
                found.append((full if full in MODULES else node.module, node.lineno, id(node) in top))
    return found


def _edges(top_only: bool) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for name, _, at_top in _imports(module):
            target = _resolve(name) if name.split(".")[0] == "pipeline" else None
            if target and target != module and (at_top or not top_only):
                edges[module].add(target)
    return edges


def _heavy_closure() -> dict[str, set[str]]:
    """The heavy third-party modules each pipeline module imports at start-up (top level, transitively)."""
    direct = {m: {n.split(".")[0] for n, _, top in _imports(m) if top and n.split(".")[0] in HEAVY} for m in MODULES}
    edges = _edges(top_only=True)
    out: dict[str, set[str]] = {}

    def visit(m: str, seen: set[str]) -> set[str]:
        if m in out:
            return out[m]
        heavy = set(direct[m])
        for t in edges[m] - seen:
            heavy |= visit(t, seen | {m})
        out[m] = heavy
        return heavy

    for m in MODULES:
        visit(m, set())
    return out


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (found := dfs(t)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := dfs(m)):
            return found
    return None


def test_the_graph_is_read_from_the_source():
    edges = _edges(top_only=False)
    assert "pipeline.config.plugins" in edges["pipeline.config.rules"]  # a real edge is seen
    assert len(MODULES) > 50


def test_no_import_cycle_even_counting_imports_inside_functions():
    cycle = _cycle(_edges(top_only=False))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_plugin_module_is_the_ground_floor():
    # beside it only slime's stand-in types, which import the package's types by name when a
    # plugin asks for them (pipeline/slime/stand_ins.py)
    edges = _edges(top_only=False)
    assert edges["pipeline.config.plugins"] == {"pipeline.slime.stand_ins"}
    assert edges["pipeline.slime.stand_ins"] == set()


def test_function_level_pipeline_imports_only_defer_heavy_modules():
    heavy = _heavy_closure()
    bad = []
    for module in MODULES:
        for name, line, at_top in _imports(module):
            target = _resolve(name) if name.split(".")[0] == "pipeline" else None
            if at_top or target is None or target == module:
                continue
            if not heavy[target] - heavy[module]:
                bad.append(f"{MODULES[module].relative_to(ROOT.parent)}:{line}: import of {target} inside a function "
                           f"defers nothing heavy ({sorted(heavy[target]) or 'no heavy module'}); move it to the top")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("source, expected", [
    ("def f():\n    from pipeline.process.atomic import atomic_write_text\n", True),
    ("from pipeline.process.atomic import atomic_write_text\n", False),
])
def test_the_check_tells_a_function_level_import(source, expected, tmp_path, monkeypatch):
    path = tmp_path / "probe.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, "pipeline.probe", path)
    assert any(not top for _, _, top in _imports("pipeline.probe")) is expected


def test_modules_live_in_subpackages():
    top = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 2, f"top-level modules beside pipeline/__init__.py (at most two): {top}"


def test_no_module_imports_from_the_package_root():
    bad = [f"{MODULES[m].relative_to(ROOT.parent)}:{line}" for m in MODULES if m != "pipeline"
           for name, line, _ in _imports(m) if name == "pipeline"]
    assert not bad, "imports from the top floor `pipeline` (import from the defining module): " + ", ".join(bad)


def _moved() -> dict[str, str]:
    """pipeline.MOVED, read from the source (importing nothing)."""
    tree = ast.parse((ROOT / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "MOVED":
            return ast.literal_eval(node.value)
    raise AssertionError("pipeline/__init__.py defines no MOVED table")


def test_nothing_in_the_project_names_a_moved_module_path():
    moved = _moved()
    assert "pipeline.sample" in moved and moved["pipeline.plugins"] == "pipeline.config.plugins"
    pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(old) for old in moved) + r")(?![\w])")
    bad = []
    for folder in ("pipeline", "conf", "scripts", "bench", "examples"):
        for path in sorted((PROJECT / folder).rglob("*")):
            if path.suffix not in {".py", ".yaml"} or path == ROOT / "__init__.py" or "__pycache__" in path.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if found := pattern.search(line):
                    bad.append(f"{path.relative_to(PROJECT)}:{number}: {found.group(1)} -> {moved[found.group(1)]}")
    assert not bad, "old module paths (deprecated aliases):\n" + "\n".join(bad)
