"""The bundled prompt sets: reproducible from the generator, labels right, no overlap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data"
OPS = {"add": lambda a, b: a + b, "word_add": lambda a, b: a + b, "sub": lambda a, b: a - b,
       "word_sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "word_mul": lambda a, b: a * b}


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def test_generator_reproduces_the_shipped_files(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(DATA / "generate_prompts.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, timeout=60)
    for name in ("math_train.jsonl", "math_eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes()


def test_labels_match_the_operands_and_sets_are_disjoint() -> None:
    train, evals = rows("math_train.jsonl"), rows("math_eval.jsonl")
    assert len(train) >= 500 and len(evals) >= 50
    for row in train + evals:
        a, b = row["metadata"]["operands"]
        assert row["label"] == str(OPS[row["metadata"]["kind"]](a, b))
        assert str(a) in row["input"] and str(b) in row["input"]
        assert row["input"].endswith("Answer with just the number.")
    assert not {r["input"] for r in train} & {r["input"] for r in evals}
    assert {r["metadata"]["kind"] for r in evals} == set(OPS)
