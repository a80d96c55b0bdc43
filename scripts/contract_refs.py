"""Point every citation of the old out-of-repo contract (`SPEC §N`, "the SPEC metrics") at
docs/contracts.md, which keeps SPEC's section numbers, then regenerate the config-groups tables
(their text comes from the YAML comments).

    python scripts/contract_refs.py          # rewrite tracked files in place
    python scripts/contract_refs.py --check  # exit 1 when a file still cites SPEC

Idempotent: re-run it after merging a branch that still says `SPEC §N`. tests/test_docs.py checks
the result (every `docs/contracts.md §N` names a section; no `SPEC` left).
"""

from __future__ import annotations

import argparse
import logging
import re
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger("contract_refs")

ROOT = Path(__file__).resolve().parents[1]
# (pattern, replacement), applied in order
RULES = [
    (re.compile(r"\bSPEC §"), "docs/contracts.md §"),
    (re.compile(r"\bSPEC (metrics|vectors)\b"), r"docs/contracts.md §7 \1"),
]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh"}


def tracked_files() -> list[Path]:
    """Text files git tracks (this script left out: it names the patterns)."""
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    paths = [ROOT / n for n in names.splitlines() if Path(n).suffix in SUFFIXES]
    return [p for p in paths if p.resolve() != Path(__file__).resolve() and p.is_file()]


def rewrite(text: str) -> str:
    """`text` with every rule applied."""
    for pattern, replacement in RULES:
        text = pattern.sub(replacement, text)
    return text


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with --check, list) the files that still cite SPEC."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    changed = []
    for path in tracked_files():
        text = path.read_text(encoding="utf-8")
        new = rewrite(text)
        if new != text:
            changed.append(path)
            if not ns.check:
                path.write_text(new, encoding="utf-8")
            logger.info("%s %s", "stale:" if ns.check else "rewrote", path.relative_to(ROOT))
    if ns.check:
        return 1 if changed else 0
    # docs/configuration.md and docs/config_groups.md carry the YAML comments: regenerate them
    subprocess.run([sys.executable, "-m", "pipeline.config.docs"], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
