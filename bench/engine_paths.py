"""Before/after of the hf engine's decode path, side by side in one process (used by
bench/engine.py; `python bench/engine_paths.py` runs it alone).

"before" is today's path kept selectable (`decode_impl=legacy`, float32: transformers forward
with a `DynamicCache`, a Python loop of `multinomial`s); "after" is the default of
conf/engine/hf.yaml (static KV cache, lean decode step, batched sampling, bfloat16) and the same
static path in float32. At each batch size every engine generates the same seeded requests,
interleaved and repeated; the table gives the median wall tokens/s and tokens per CPU-second
(process time: robust on a shared machine where wall time includes waiting for a core), the
ratio to "before", the load average, and the share of the CPU's arithmetic peak reached.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see bench/engine.py)

from pipeline.engines.base import GenerationRequest, SamplingParams  # noqa: E402

# SmolLM2-135M: ~134 M multiply-adds per token (30 layers + the tied 49k x 576 output matrix)
GFLOP_PER_TOKEN = 0.27
# 2 cores x 2.6 GHz x 2 AVX-512 FMA units x 16 float32 lanes x 2 flops; BF16 dot products double it
PEAK_GFLOPS = {"float32": 160.0, "bfloat16": 320.0}


def default_engine_kwargs() -> dict[str, Any]:
    """dtype / decode_impl / max_batch_size of conf/engine/hf.yaml (the shipped default; its
    `auto` dtype resolved for this CPU, outside deterministic mode)."""
    from omegaconf import OmegaConf

    from pipeline.precision import resolve_dtype

    conf = OmegaConf.load(ROOT / "conf" / "engine" / "hf.yaml")
    out = {k: conf[k] for k in ("decode_impl", "max_batch_size", "packed_matmuls")}
    return {**out, "dtype": resolve_dtype("auto")}


def engines(model: str, compiled: bool = False) -> dict[str, Any]:
    """The engines compared: before (legacy float32), after (the default), static float32 without
    oneDNN-packed weights, and
    with `compiled` the default with `compile_decode=True`."""
    from pipeline.engines.hf import HFEngine

    default = default_engine_kwargs()
    specs = {
        "before: legacy, float32": dict(decode_impl="legacy", dtype="float32"),
        f"after: {default['decode_impl']}, {default['dtype']} (default)":
            dict(decode_impl=default["decode_impl"], dtype=default["dtype"], packed_matmuls=default["packed_matmuls"]),
        "static, float32, aten::linear (packed_matmuls=false)":
            dict(decode_impl="static", dtype="float32", packed_matmuls=False),
    }
    if compiled:
        specs[f"static, {default['dtype']}, compile_decode"] = dict(
            decode_impl="static", dtype=default["dtype"], compile_decode=True)
    out = {}
    for label, kw in specs.items():
        engine = HFEngine(model, num_threads=2, max_batch_size=64, **kw)
        engine.start()
        out[label] = engine
    return out


async def _batch(engine: Any, prompts: list[list[int]], tokens: int) -> int:
    res = await asyncio.gather(*(engine.generate(GenerationRequest(
        f"b{i}", input_ids=p, sampling=SamplingParams(max_new_tokens=tokens, temperature=1.0, seed=i)))
        for i, p in enumerate(prompts)))
    return sum(len(r.output_ids) for r in res)


def bench_paths(engines_: dict[str, Any], prompts: list[list[int]], batch_sizes: list[int],
                tokens: int, reps: int, group: int = 1) -> list[dict[str, Any]]:
    """Rows of (batch, engine, wall tokens/s, tokens/CPU-s, load, first-call seconds) medians
    over `reps`; the first call at each batch size (a 4-token warm-up of the whole batch) pays
    allocations and, with compile_decode, compilation. A batch is `group` seeded samples of each
    of the first batch / group prompts (1: every request its own prompt; n: GRPO's groups)."""
    rows = []
    for batch in batch_sizes:
        if -(-batch // group) > len(prompts):
            raise ValueError(f"batch {batch} in groups of {group} needs {-(-batch // group)} prompts, "
                             f"got {len(prompts)}")
        subset = [prompts[i // group] for i in range(batch)]
        first: dict[str, float] = {}
        for label, engine in engines_.items():
            t0 = time.perf_counter()
            asyncio.run(_batch(engine, subset, 4))
            first[label] = time.perf_counter() - t0
        wall: dict[str, list[float]] = {k: [] for k in engines_}
        cpu: dict[str, list[float]] = {k: [] for k in engines_}
        loads = []
        for _ in range(reps):
            for label, engine in engines_.items():
                t0, c0 = time.perf_counter(), time.process_time()
                n = asyncio.run(_batch(engine, subset, tokens))
                wall[label].append(n / (time.perf_counter() - t0))
                cpu[label].append(n / (time.process_time() - c0))
                loads.append(os.getloadavg()[0])
        for label in engines_:
            rows.append({"batch": batch, "engine": label, "wall": statistics.median(wall[label]),
                         "cpu": statistics.median(cpu[label]), "load": statistics.mean(loads),
                         "first_s": first[label]})
    return rows


def print_paths(rows: list[dict[str, Any]]) -> None:
    """The before/after table (ratios against the legacy float32 row of the same batch)."""
    print("| batch | engine | tokens/s (wall) | × before | tokens per CPU-second | × before | "
          "share of CPU peak (wall; per CPU-second) | first call (s) | load avg |\n"
          "|---|---|---|---|---|---|---|---|---|")
    base = {r["batch"]: r for r in rows if r["engine"].startswith("before")}
    for r in rows:
        b = base[r["batch"]]
        dtype = "bfloat16" if "bfloat16" in r["engine"] else "float32"
        peak = r["wall"] * GFLOP_PER_TOKEN / PEAK_GFLOPS[dtype]
        per_core = r["cpu"] * GFLOP_PER_TOKEN / (PEAK_GFLOPS[dtype] / 2)
        print(f"| {r['batch']} | {r['engine']} | {r['wall']:.1f} | {r['wall'] / b['wall']:.2f} | "
              f"{r['cpu']:.1f} | {r['cpu'] / b['cpu']:.2f} | {100 * peak:.1f}%; {100 * per_core:.0f}% of {dtype} | {r['first_s']:.1f} | {r['load']:.1f} |")
    print()


def bench_cli_wall(reps: int = 1, compiled: bool = False) -> dict[str, float]:
    """`python run.py` wall time, default engine vs `engine.decode_impl=legacy engine.dtype=float32`
    (and with `compiled`, `engine.compile_decode=true`; interleaved, min over `reps`)."""
    variants = {"after (default)": [], "before (legacy, float32)": ["engine.decode_impl=legacy",
                                                                     "engine.dtype=float32"]}
    if compiled:
        variants["after + engine.compile_decode=true"] = ["engine.compile_decode=true"]
    best: dict[str, float] = {}
    for _ in range(reps):
        for label, extra in variants.items():
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [sys.executable, str(ROOT / "run.py"), "logger=jsonl", "rollout.progress=false",
                       f"hydra.run.dir={tmp}", *extra]
                t0 = time.perf_counter()
                subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                best[label] = min(best.get(label, float("inf")), time.perf_counter() - t0)
    return best


def main() -> None:
    import argparse

    from pipeline.engines.assets import default_cache_dir, resolve_checkpoint

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--group", type=int, default=1, help="samples per prompt in a batch (1: all distinct)")
    p.add_argument("--cli", action="store_true", help="also time `python run.py` before/after")
    p.add_argument("--compile", action="store_true", help="also the default with compile_decode=True")
    a = p.parse_args()
    model = resolve_checkpoint("smollm2-135m-instruct", default_cache_dir())
    engs = engines(model, compiled=a.compile)
    try:
        prompts = train_prompts(next(iter(engs.values())).tokenizer)
        print_paths(bench_paths(engs, prompts, [int(x) for x in a.batches.split(",")], a.tokens, a.reps,
                                a.group))
    finally:
        for e in engs.values():
            e.close()
    if a.cli:
        for label, wall in bench_cli_wall(compiled=a.compile).items():
            print(f"| `python run.py`, {label} | {wall:.1f} s | load {os.getloadavg()[0]:.1f} |")


def train_prompts(tok: Any) -> list[list[int]]:
    """Chat prompt ids of the bundled training questions (data/math_train.jsonl), first 64."""
    import json

    lines = (ROOT / "data" / "math_train.jsonl").read_text().splitlines()
    return [chat_prompt(tok, json.loads(line)["input"]) for line in lines if line.strip()][:64]


def chat_prompt(tok: Any, question: str) -> list[int]:
    """Prompt ids of one chat turn with the generation prompt."""
    ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                  tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


if __name__ == "__main__":
    main()
