"""The docs hold together: every `docs/contracts.md §N` reference in the repository names a
section of docs/contracts.md, nothing cites the old out-of-repo contract, the local links of
README.md and docs/*.md resolve, every command block is run by a test or says why not, and the
README stays short, linking pages of the site (mkdocs.yml; `make docs` builds it strictly)."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "docs" / "contracts.md"
# text files that may cite the contract (generated and vendored folders left out)
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cfg"}
SKIP_DIRS = {"outputs", "multirun", "data", "node_modules", "__pycache__"}
# "contracts.md §7", "contracts.md §3-4", "contracts.md §6, §8", "contracts.md §2-§5"
SECTION = r"§\s*\d+(?:\s*[-–]\s*§?\s*\d+)?"
REFERENCE = re.compile(rf"contracts\.md\s+({SECTION}(?:\s*(?:,|and|or)\s*{SECTION})*)")
# the old contract lived outside the repository and was cited by the bare word SPEC (with a
# section sign, as a .md file, "the ... metrics"); SPEC_KEYS and the like are other names
OLD = re.compile(r"\bSPEC\b")
# files that name the old citation on purpose: this test and the script that rewrites them
EXEMPT = {Path(__file__).resolve(), ROOT / "scripts" / "contract_refs.py"}


def text_files() -> list[Path]:
    """Every text file of the repository that could carry a reference."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")]
        out += [Path(folder) / f for f in files if Path(f).suffix in SUFFIXES or f in ("Makefile", "run")]
    return sorted(out)


def sections(text: str) -> set[int]:
    """Section numbers of `## N. Title` headings."""
    return {int(n) for n in re.findall(r"^## (\d+)\. \S", text, flags=re.M)}


def cited(group: str) -> list[int]:
    """Section numbers a reference names, ranges expanded (`§3-4` -> 3, 4)."""
    out: list[int] = []
    for lo, hi in re.findall(r"§\s*(\d+)(?:\s*[-–]\s*§?\s*(\d+))?", group):
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def test_contract_sections_are_numbered_in_order():
    numbers = re.findall(r"^## (\d+)\. \S", CONTRACT.read_text(encoding="utf-8"), flags=re.M)
    assert [int(n) for n in numbers] == list(range(1, len(numbers) + 1)), numbers


def test_every_contract_reference_names_a_section():
    existing = sections(CONTRACT.read_text(encoding="utf-8"))
    found, broken = 0, []
    for path in text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        refs = [m.group(1) for m in REFERENCE.finditer(text)]
        found += len(refs)
        if path == CONTRACT:  # inside the contract a bare "§N" is a reference too
            refs += re.findall(SECTION, text)
        for ref in refs:
            broken += [f"{path.relative_to(ROOT)}: {ref!r} -> §{n}" for n in cited(ref) if n not in existing]
    assert found >= 20, f"only {found} references to docs/contracts.md found; did their syntax change?"
    assert not broken, "references to sections docs/contracts.md does not have:\n" + "\n".join(broken)


def test_reference_parsing_reads_lists_and_ranges():
    text = "see docs/contracts.md §3-4 and docs/contracts.md §6, §8; docs/contracts.md §2-§5"
    assert [cited(m.group(1)) for m in REFERENCE.finditer(text)] == [[3, 4], [6, 8], [2, 3, 4, 5]]


def test_nothing_cites_the_old_out_of_repo_spec():
    stale = []
    for path in text_files():
        if path in EXEMPT:
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OLD.search(line):
                stale.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not stale, "cite docs/contracts.md §N instead (scripts/contract_refs.py rewrites them):\n" + "\n".join(stale)


def test_local_links_of_readme_and_docs_resolve():
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same file
            if not (doc.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


# a ```bash block no test runs says why on the line before it
NOT_RUN = re.compile(r"^<!-- not run: \S.*-->$")
# the README stays a page a newcomer reads in five minutes; the rest lives in docs/ (issue #32)
README_MAX_LINES = 300


def test_every_command_block_is_run_by_a_test_or_says_why_not():
    """A ```bash block of README.md or docs/ is run whole by the test RUN_WHOLE names, or holds only
    `python run.py` lines (tests/test_readme_scale.py puts each through pre-flight), or the line
    before it is `<!-- not run: <why> -->`."""
    from tests.test_readme_scale import RUN_WHOLE, blocks

    for (page, _), test in RUN_WHOLE.items():
        path, name = test.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), test
    unexplained, marked = [], 0
    for page, heading, text in blocks():
        doc = ROOT / page if page == "README.md" else ROOT / "docs" / page
        before = doc.read_text(encoding="utf-8").split(f"```bash\n{text}```", 1)[0].rstrip("\n").rsplit("\n", 1)[-1]
        lines = [line.strip() for line in text.replace("\\\n", " ").splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
        if (page, heading) in RUN_WHOLE:
            continue
        if NOT_RUN.match(before):
            marked += 1
            continue
        if not all(line.startswith("python run.py") for line in lines):
            unexplained.append(f"{page} {heading}: {lines}")
    assert marked >= 5, "the not-run markers are no longer found; did their syntax change?"
    assert not unexplained, ("command blocks no test runs; run them in a test or put "
                             "'<!-- not run: <why> -->' on the line before:\n" + "\n".join(unexplained))


def test_the_readme_is_short_and_its_pages_are_in_the_site():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", readme))
    assert len(linked) >= 10, linked
    missing = [page for page in sorted(linked) if f": {page}" not in nav]
    assert not missing, f"README links pages that mkdocs.yml's nav lacks: {missing}"
