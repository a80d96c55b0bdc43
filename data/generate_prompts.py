"""Generate the bundled arithmetic prompt sets (seeded, reproducible).

    python data/generate_prompts.py            # writes data/math_train.jsonl, data/math_eval.jsonl

Each row: {"input": question, "label": answer as a string, "metadata": {"kind", "operands"}}.
Questions are simple arithmetic and one-step word problems that SmolLM2-135M-Instruct gets right
part of the time at temperature 1 (so rewards vary within a group); each ends with
"Answer with just the number." so a short response suffices. Train and eval share no question.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path

SUFFIX = " Answer with just the number."
NAMES = ["Tom", "Anna", "Ben", "Maria", "Sam", "Lily", "Omar", "Mei", "Lucas", "Zoe"]
ITEMS = ["apple", "book", "marble", "pencil", "cookie", "sticker", "shell", "coin"]

Row = dict[str, object]


def _add(r: random.Random) -> Row:
    a, b = r.randint(1, 20), r.randint(1, 20)
    return {"q": f"What is {a} + {b}?", "a": a + b, "kind": "add", "ops": [a, b]}


def _sub(r: random.Random) -> Row:
    a = r.randint(5, 30)
    b = r.randint(1, a - 1)
    return {"q": f"What is {a} - {b}?", "a": a - b, "kind": "sub", "ops": [a, b]}


def _mul(r: random.Random) -> Row:
    a, b = r.randint(2, 12), r.randint(2, 12)
    return {"q": f"What is {a} times {b}?", "a": a * b, "kind": "mul", "ops": [a, b]}


def _word_add(r: random.Random) -> Row:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(1, 12), r.randint(1, 12)
    q = f"{name} has {a} {item}s and gets {b} more. How many {item}s does {name} have now?"
    return {"q": q, "a": a + b, "kind": "word_add", "ops": [a, b]}


def _word_sub(r: random.Random) -> Row:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a = r.randint(4, 20)
    b = r.randint(1, a - 1)
    q = f"{name} had {a} {item}s and gave {b} away. How many {item}s does {name} have left?"
    return {"q": q, "a": a - b, "kind": "word_sub", "ops": [a, b]}


def _word_mul(r: random.Random) -> Row:
    item = r.choice(ITEMS)
    a, b = r.randint(2, 6), r.randint(2, 6)
    q = f"There are {a} bags with {b} {item}s in each bag. How many {item}s are there in total?"
    return {"q": q, "a": a * b, "kind": "word_mul", "ops": [a, b]}


KINDS: list[Callable[[random.Random], Row]] = [_add, _sub, _mul, _word_add, _word_sub, _word_mul]


def generate(n: int, rng: random.Random, seen: set[str]) -> list[dict[str, object]]:
    """`n` distinct rows not in `seen` (which is updated), kinds in round-robin order."""
    rows: list[dict[str, object]] = []
    misses = 0
    while len(rows) < n:
        item = KINDS[len(rows) % len(KINDS)](rng)
        question = str(item["q"]) + SUFFIX
        if question in seen:
            misses += 1
            if misses > 100 * n:
                raise SystemExit(f"cannot draw {n} distinct questions; lower --train/--eval")
            continue
        seen.add(question)
        rows.append({"input": question, "label": str(item["a"]),
                     "metadata": {"kind": item["kind"], "operands": item["ops"]}})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    """Write atomically (temp file + rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=20241129)
    parser.add_argument("--train", type=int, default=600)
    parser.add_argument("--eval", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ns = parser.parse_args()
    rng = random.Random(ns.seed)
    seen: set[str] = set()
    eval_rows = generate(ns.eval, rng, seen)
    train_rows = generate(ns.train, rng, seen)
    ns.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(ns.out / "math_train.jsonl", train_rows)
    write_jsonl(ns.out / "math_eval.jsonl", eval_rows)
    print(f"wrote {len(train_rows)} train and {len(eval_rows)} eval rows to {ns.out}")


if __name__ == "__main__":
    main()
