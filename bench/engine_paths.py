"""Before/after of the hf engine's decode path, side by side in one run (used by
bench/engine.py; `python bench/engine_paths.py` runs it alone).

"before" is the path before issue 13, kept selectable (`decode_impl=legacy`, float32:
transformers forward with a `DynamicCache`, a Python loop of `multinomial`s), run as `run.py`
ran it, with OpenMP threads that sleep at once, in a process of its own (`SeparateEngine`); the
same legacy path in this process, whose OpenMP threads spin (`omp_spin_count`, applied here as
`run.py` applies it); "after" is the default of conf/engine/hf.yaml (static KV cache, lean decode
step, batched sampling, oneDNN-packed matmuls, bfloat16 where the CPU has bfloat16 kernels) and
the static path in float32 with `aten::linear`. At each batch size every engine generates the
same seeded requests, interleaved and repeated; the table gives the median wall tokens/s and
tokens per CPU-second (process time: robust on a shared machine where wall time includes waiting
for a core), the ratio to "before", the load average, and the share of a large matmul's
throughput (this CPU's practical peak) reached.
"""

from __future__ import annotations

import asyncio
import functools
import json
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

from omegaconf import OmegaConf  # noqa: E402

from pipeline.process.openmp import ENV_KEYS as OPENMP_ENV_KEYS, configure_openmp_wait  # noqa: E402 - torch-free

# conf/config.yaml's `omp_spin_count`, applied as `python run.py` applies it, before torch loads
# (an OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment wins): the engines run at the default
OPENMP_WAIT = configure_openmp_wait(OmegaConf.load(ROOT / "conf" / "config.yaml")["omp_spin_count"])

from pipeline.engines.base import GenerationRequest, SamplingParams  # noqa: E402

# SmolLM2-135M: ~134 M multiply-adds per token (30 layers + the tied 49k x 576 output matrix)
GFLOP_PER_TOKEN = 0.27
# the engines' torch threads, the cores the peak is measured on
THREADS = 2


@functools.cache
def matmul_peak_gflops(dtype: str) -> float:
    """This CPU's arithmetic peak in `dtype` as torch reaches it: GFLOP/s of a large square
    matmul on THREADS threads (best of 5; AMX, AVX-512 BF16 or AVX2 alike, no table of CPU
    models). A decode step cannot beat it; its share says how much of the CPU a step uses."""
    import torch

    torch.set_num_threads(THREADS)
    a = torch.randn(2048, 2048, dtype=getattr(torch, dtype))
    a @ a  # warm-up: packs, thread start
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * 2048 ** 3 / best / 1e9


def default_engine_kwargs() -> dict[str, Any]:
    """dtype / decode_impl / max_batch_size of conf/engine/hf.yaml (the shipped default; its
    `auto` dtype resolved for this CPU, outside deterministic mode)."""
    from omegaconf import OmegaConf

    from pipeline.process.precision import resolve_dtype

    conf = OmegaConf.load(ROOT / "conf" / "engine" / "hf.yaml")
    out = {k: conf[k] for k in ("decode_impl", "max_batch_size", "packed_matmuls", "native_kernels")}
    return {**out, "dtype": resolve_dtype("auto")}


def engines(model: str, compiled: bool = False) -> dict[str, Any]:
    """The engines compared: before (legacy float32, in a process of its own whose OpenMP
    threads sleep at once, as `run.py` had them), the same in this process (spinning OpenMP
    threads), after (the default), the default without the native kernels (PyTorch ops between
    the matmuls), static float32 without oneDNN-packed weights, and with
    `compiled` the default with `compile_decode=True`."""
    from pipeline.engines.hf import HFEngine

    default = default_engine_kwargs()
    legacy = dict(decode_impl="legacy", dtype="float32")
    out: dict[str, Any] = {"before: legacy, float32, OpenMP threads sleep (as the run had it)": SeparateEngine(
        model, {"OMP_WAIT_POLICY": "PASSIVE"}, **legacy)}
    specs = {
        "legacy, float32, in this process (OpenMP threads spin)": legacy,
        f"after: {default['decode_impl']}, {default['dtype']} (default)":
            dict(decode_impl=default["decode_impl"], dtype=default["dtype"], packed_matmuls=default["packed_matmuls"],
                 native_kernels=default["native_kernels"]),
        f"static, {default['dtype']}, PyTorch ops between the matmuls (native_kernels=false)":
            dict(decode_impl="static", dtype=default["dtype"], packed_matmuls=default["packed_matmuls"],
                 native_kernels=False),
        "static, float32, aten::linear (packed_matmuls=false)":
            dict(decode_impl="static", dtype="float32", packed_matmuls=False),
    }
    if compiled:
        specs[f"static, {default['dtype']}, compile_decode"] = dict(
            decode_impl="static", dtype=default["dtype"], compile_decode=True)
    for label, kw in specs.items():
        engine = HFEngine(model, num_threads=THREADS, max_batch_size=64, **kw)
        engine.start()
        out[label] = engine
    return out


async def _batch(engine: Any, prompts: list[list[int]], tokens: int) -> int:
    res = await asyncio.gather(*(engine.generate(GenerationRequest(
        f"b{i}", input_ids=p, sampling=SamplingParams(max_new_tokens=tokens, temperature=1.0, seed=i)))
        for i, p in enumerate(prompts)))
    return sum(len(r.output_ids) for r in res)


def _measure(engine: Any, subset: list[list[int]], tokens: int) -> tuple[int, float, float]:
    """(tokens generated, wall seconds, CPU seconds of the process that generated them)."""
    if isinstance(engine, SeparateEngine):
        return engine.measure(subset, tokens)
    t0, c0 = time.perf_counter(), time.process_time()
    n = asyncio.run(_batch(engine, subset, tokens))
    return n, time.perf_counter() - t0, time.process_time() - c0


class SeparateEngine:
    """An hf engine in a process of its own, with its own OpenMP environment: "before" as the run
    had it (OMP_WAIT_POLICY=PASSIVE, which `run.py` set before `omp_spin_count`), which this
    process, already spinning, cannot give it. The parent sends each batch's prompts; the child
    generates and answers with its token count and its own wall and CPU seconds."""

    def __init__(self, model: str, env: dict[str, str], **engine_kwargs: Any) -> None:
        child_env = {k: v for k, v in os.environ.items() if k not in OPENMP_ENV_KEYS} | env
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-engine", model, json.dumps(engine_kwargs)],
                                     cwd=ROOT, env=child_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the separate engine process did not start")

    def measure(self, subset: list[list[int]], tokens: int) -> tuple[int, float, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"prompts": subset, "tokens": tokens}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        return answer["n"], answer["wall"], answer["cpu"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _serve_engine(model: str, engine_kwargs: str) -> None:
    """The child of `SeparateEngine`: one JSON request per stdin line, one JSON answer per line."""
    from pipeline.engines.hf import HFEngine

    engine = HFEngine(model, num_threads=THREADS, max_batch_size=64, **json.loads(engine_kwargs))
    engine.start()
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        n, wall, cpu = _measure(engine, request["prompts"], request["tokens"])
        print(json.dumps({"n": n, "wall": wall, "cpu": cpu}), flush=True)
    engine.close()


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
        first = {label: _measure(engine, subset, 4)[1] for label, engine in engines_.items()}
        wall: dict[str, list[float]] = {k: [] for k in engines_}
        cpu: dict[str, list[float]] = {k: [] for k in engines_}
        loads = []
        for _ in range(reps):
            for label, engine in engines_.items():
                n, wall_s, cpu_s = _measure(engine, subset, tokens)
                wall[label].append(n / wall_s)
                cpu[label].append(n / cpu_s)
                loads.append(os.getloadavg()[0])
        for label in engines_:
            rows.append({"batch": batch, "engine": label, "wall": statistics.median(wall[label]),
                         "cpu": statistics.median(cpu[label]), "load": statistics.mean(loads),
                         "first_s": first[label]})
    return rows


def print_paths(rows: list[dict[str, Any]]) -> None:
    """The before/after table (ratios against the legacy float32 row of the same batch)."""
    print("| batch | engine | tokens/s (wall) | × before | tokens per CPU-second | × before | "
          "share of matmul peak (wall; per CPU-second) | first call (s) | load avg |\n"
          "|---|---|---|---|---|---|---|---|---|")
    base = {r["batch"]: r for r in rows if r["engine"].startswith("before")}
    for r in rows:
        b = base[r["batch"]]
        dtype = "bfloat16" if "bfloat16" in r["engine"] else "float32"
        peak = r["wall"] * GFLOP_PER_TOKEN / matmul_peak_gflops(dtype)
        per_core = r["cpu"] * GFLOP_PER_TOKEN / (matmul_peak_gflops(dtype) / THREADS)
        print(f"| {r['batch']} | {r['engine']} | {r['wall']:.1f} | {r['wall'] / b['wall']:.2f} | "
              f"{r['cpu']:.1f} | {r['cpu'] / b['cpu']:.2f} | {100 * peak:.1f}%; {100 * per_core:.0f}% of {dtype} | {r['first_s']:.1f} | {r['load']:.1f} |")
    print(f"{OPENMP_WAIT}.")
    print("Peak: a 2048 x 2048 matmul on %d threads, %s." % (THREADS, ", ".join(
        f"{d} {matmul_peak_gflops(d):.0f} GFLOP/s" for d in ("float32", "bfloat16"))))
    print()


def bench_cli_wall(reps: int = 1, compiled: bool = False) -> dict[str, float]:
    """`python run.py` wall time, the default against the run before issue 13's changes:
    `engine.decode_impl=legacy engine.dtype=float32 omp_spin_count=0` (OpenMP threads slept at
    once then); with `compiled` also `engine.compile_decode=true`; interleaved, min over `reps`.
    The subprocesses get no OMP_WAIT_POLICY / GOMP_SPINCOUNT of ours, so each applies its own."""
    variants = {"after (default)": [], "before (legacy, float32, OpenMP threads sleep at once)": [
        "engine.decode_impl=legacy", "engine.dtype=float32", "omp_spin_count=0"]}
    if compiled:
        variants["after + engine.compile_decode=true"] = ["engine.compile_decode=true"]
    best: dict[str, float] = {}
    for _ in range(reps):
        for label, extra in variants.items():
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [sys.executable, str(ROOT / "run.py"), "logger=jsonl", "rollout.progress=false",
                       f"hydra.run.dir={tmp}", *extra]
                env = {k: v for k, v in os.environ.items() if k not in OPENMP_ENV_KEYS}
                t0 = time.perf_counter()
                subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
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
    p.add_argument("--serve-engine", nargs=2, metavar=("MODEL", "KWARGS_JSON"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve_engine:
        _serve_engine(*a.serve_engine)
        return
    model = resolve_checkpoint("smollm2-135m-instruct", default_cache_dir())
    engs = engines(model, compiled=a.compile)
    try:
        prompts = train_prompts(tokenizer_of(engs))
        print_paths(bench_paths(engs, prompts, [int(x) for x in a.batches.split(",")], a.tokens, a.reps,
                                a.group))
    finally:
        for e in engs.values():
            e.close()
    if a.cli:
        for label, wall in bench_cli_wall(compiled=a.compile).items():
            print(f"| `python run.py`, {label} | {wall:.1f} s | load {os.getloadavg()[0]:.1f} |")


def tokenizer_of(engines_: dict[str, Any]) -> Any:
    """The tokenizer of the first engine in this process (all of them load the same model)."""
    return next(e for e in engines_.values() if not isinstance(e, SeparateEngine)).tokenizer


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
