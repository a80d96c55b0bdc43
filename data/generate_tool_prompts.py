"""Generate the bundled tool-use prompt sets of `experiment=tools` (seeded, reproducible).

    python data/generate_tool_prompts.py       # writes data/tools_{train,eval}.jsonl and
                                               # data/tools_direct_{train,eval}.jsonl

The task is arithmetic on numbers too large for SmolLM2-135M to compute in its head (products of
a 3-4 digit and a 2-3 digit number, sums and differences of 5-6 digit numbers), where a
calculator turns it into copying: call the tool with the expression, then copy its result into
`\\boxed{}`. Each row's prompt is a message list: a short system line, two worked examples on
small numbers, then the question. The two sets hold the same questions:

- `tools_*`: the examples call the calculator (Hermes `<tool_call>` JSON, answered by a tool
  turn) before answering; the agent loop (`rollout.generate=agent`) adds the tool list to the
  system message and runs the calls;
- `tools_direct_*`: the examples answer at once, the baseline without tools
  (`experiment=tools_direct`).

Each row: {"input": messages, "label": the answer as a string, "metadata": {"kind", "operands"}}.
Train and eval share no question.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path

SYSTEM = "You are a careful assistant. Give the final answer as \\boxed{number}."
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'
# (question, expression, answer) of the two worked examples
SHOTS = (("What is 23 * 41?", "23 * 41", "943"), ("What is 1520 + 384?", "1520 + 384", "1904"))

Item = tuple[str, str, int, str, list[int]]  # question, expression, answer, kind, operands


def _mul(r: random.Random) -> Item:
    a, b = r.randint(100, 9999), r.randint(12, 999)
    return f"What is {a} * {b}?", f"{a} * {b}", a * b, "mul", [a, b]


def _add(r: random.Random) -> Item:
    a, b = r.randint(10_000, 999_999), r.randint(10_000, 999_999)
    return f"What is {a} + {b}?", f"{a} + {b}", a + b, "add", [a, b]


def _sub(r: random.Random) -> Item:
    a = r.randint(100_000, 999_999)
    b = r.randint(10_000, a - 1)
    return f"What is {a} - {b}?", f"{a} - {b}", a - b, "sub", [a, b]


KINDS: list[Callable[[random.Random], Item]] = [_mul, _add, _mul, _sub]


def messages(question: str, tools: bool) -> list[dict[str, str]]:
    """The prompt of one question: the system line, the two examples (with or without the
    calculator), the question."""
    out = [{"role": "system", "content": SYSTEM}]
    for q, expression, answer in SHOTS:
        out.append({"role": "user", "content": q})
        if tools:
            out += [{"role": "assistant", "content": CALL % expression}, {"role": "tool", "content": answer}]
        out.append({"role": "assistant", "content": f"The answer is \\boxed{{{answer}}}."})
    return out + [{"role": "user", "content": question}]


def generate(n: int, rng: random.Random, seen: set[str]) -> list[Item]:
    """`n` distinct questions not in `seen` (which is updated), kinds in round-robin order."""
    items: list[Item] = []
    while len(items) < n:
        item = KINDS[len(items) % len(KINDS)](rng)
        if item[0] not in seen:
            seen.add(item[0])
            items.append(item)
    return items


def rows(items: list[Item], tools: bool) -> list[dict[str, object]]:
    return [{"input": messages(q, tools), "label": str(answer), "metadata": {"kind": kind, "operands": ops}}
            for q, _, answer, kind, ops in items]


def write_jsonl(path: Path, data: list[dict[str, object]]) -> None:
    """Write atomically (temp file + rename), with the permissions the umask gives a new file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    with os.fdopen(fd, "w") as f:
        for row in data:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=20261203)
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--eval", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ns = parser.parse_args()
    rng = random.Random(ns.seed)
    seen: set[str] = set()
    eval_items = generate(ns.eval, rng, seen)
    train_items = generate(ns.train, rng, seen)
    ns.out.mkdir(parents=True, exist_ok=True)
    for prefix, tools in (("tools", True), ("tools_direct", False)):
        write_jsonl(ns.out / f"{prefix}_train.jsonl", rows(train_items, tools))
        write_jsonl(ns.out / f"{prefix}_eval.jsonl", rows(eval_items, tools))
    print(f"wrote {len(train_items)} train and {len(eval_items)} eval questions, with and without tools, to {ns.out}")


if __name__ == "__main__":
    main()
