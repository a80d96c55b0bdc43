"""The bundled prompt sets of experiment=tools / tools_direct: reproducible from the generator,
labels right, train and eval disjoint, the two variants the same questions, the worked examples'
tool calls what the calculator answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.agent.calculator import calculator

DATA = Path(__file__).resolve().parents[2] / "data"
NAMES = ("tools_train.jsonl", "tools_eval.jsonl", "tools_direct_train.jsonl", "tools_direct_eval.jsonl")
OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}
SIGNS = {"add": "+", "sub": "-", "mul": "*"}


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def test_generator_reproduces_the_shipped_files(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(DATA / "generate_tool_prompts.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, timeout=60)
    for name in NAMES:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


def test_labels_are_the_operations_and_the_sets_are_disjoint() -> None:
    train, evals = rows("tools_train.jsonl"), rows("tools_eval.jsonl")
    assert len(train) >= 300 and len(evals) >= 50
    for row in train + evals:
        a, b = row["metadata"]["operands"]
        assert row["label"] == str(OPS[row["metadata"]["kind"]](a, b))
        sign = SIGNS[row["metadata"]["kind"]]
        assert row["input"][-1] == {"role": "user", "content": f"What is {a} {sign} {b}?"}
    assert not {r["input"][-1]["content"] for r in train} & {r["input"][-1]["content"] for r in evals}
    assert {r["metadata"]["kind"] for r in evals} == set(OPS)


def test_the_variants_ask_the_same_and_only_the_tool_one_shows_calls() -> None:
    for split in ("train", "eval"):
        tools, direct = rows(f"tools_{split}.jsonl"), rows(f"tools_direct_{split}.jsonl")
        assert [(r["input"][-1], r["label"]) for r in tools] == [(r["input"][-1], r["label"]) for r in direct]
        assert all(not any(m["role"] == "tool" or "<tool_call>" in m["content"] for m in r["input"]) for r in direct)
    shots = rows("tools_eval.jsonl")[0]["input"]
    for call, result in zip(shots, shots[1:]):
        if call["role"] == "assistant" and "<tool_call>" in call["content"]:
            body = json.loads(call["content"].split("<tool_call>")[1].split("</tool_call>")[0])
            assert result["role"] == "tool" and calculator(**body["arguments"]) == result["content"]
