"""The mutation map (scripts/mutation.py: module -> the tests that pin it) names real files, and
covers the modules issue #32 asked for with every test file that exercises them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def modules() -> dict[str, tuple[list[str], list[str] | None]]:
    spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts" / "mutation.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script.MODULES


def test_every_mapped_module_and_test_file_exists(modules):
    missing = [path for module, (tests, _) in modules.items() for path in (module, *tests) if not (ROOT / path).is_file()]
    assert not missing, f"the mutation map names files that do not exist: {missing}"


@pytest.mark.parametrize("module, must", [
    ("pipeline/run/run_record.py", {"tests/test_run_record.py", "tests/resume/test_resume_upgrade.py"}),
    ("pipeline/run/run_lock.py", {"tests/test_run_dir.py", "tests/resume/test_resume_kill.py"}),
    ("pipeline/rollout/over_sampling.py", {"tests/rollout/test_plugins_and_adaptive.py",
                                           "tests/resume/test_resume_kill.py"}),
    ("pipeline/samples/versions.py", {"tests/rollout/test_weight_versions.py", "tests/data/test_property.py"}),
    ("pipeline/engines/hf_sampling.py", {"tests/engines/test_hf_static.py"}),
])
def test_the_issue_32_rows_and_the_test_files_that_import_their_module(modules, module, must):
    tests = set(modules[module][0])
    assert must <= tests
    dotted = module.removesuffix(".py").replace("/", ".")
    package, _, name = dotted.rpartition(".")
    importing = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                 if dotted in (text := p.read_text()) or f"from {package} import {name}" in text}
    assert importing <= tests, f"{module}: test files importing it but not mapped: {sorted(importing - tests)}"
