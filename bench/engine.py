"""Engine / rollout benchmark (`make bench-engine`); prints Markdown tables.

Side by side in one run:
0. the engine before (legacy float32 decode path) and after (the default static path) at batch
   1 / 8 / 32 / 64 (`bench/engine_paths.py`), and `python run.py` wall time before/after (--cli-wall);
1. raw batched generation tokens/s (hf engine, all requests at once) vs the rollout stage's
   tokens/s (EngineRollout, same engine, same batch size, real math reward) — target >= 0.9;
   both with batch-invariant log-probs (deterministic mode), and raw generation without them
   (their cost);
2. the in-process engine with 2 threads vs 2 Ray replicas with 1 thread each (overhead <= 10%);
3. per-replica throughput and Ray's per-request overhead (sequential 1-token requests:
   client wall time minus engine busy time, Ray minus in-process) to argue scaling;
4. fixed vs adaptive over-sampling: generated tokens per kept group (scripted engine with a
   per-token delay, nonzero_std filter, real math reward);
5. the time of every non-generation stage as a share of a rollout step (the real CLI, hf engine).

Usage: python bench/engine.py [--groups 4] [--n 4] [--tokens 32] [--skip-paths] [--cli-wall]
       [--compile] [--skip-ray] [--skip-cli]
"""

from __future__ import annotations

import argparse
import asyncio
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
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench import engine_paths  # noqa: E402 - first: applies conf/config.yaml's omp_spin_count before torch loads
from pipeline.data.sources import BufferedDataSource, PlainDataSource  # noqa: E402
from pipeline.engines.assets import default_cache_dir, resolve_checkpoint  # noqa: E402
from pipeline.engines.base import GenerationRequest, SamplingParams  # noqa: E402
from pipeline.rollout.async_loop import run_sync  # noqa: E402
from pipeline.rollout.engine_rollout import EngineRollout  # noqa: E402
from pipeline.rollout.sample_generate import sample_seed  # noqa: E402


def _args(**kw: Any) -> Any:
    from types import SimpleNamespace

    base = dict(rollout_batch_size=4, n_samples_per_prompt=4, over_sampling_batch_size=4,
                rollout_temperature=1.0, rollout_top_p=1.0, rollout_top_k=-1, rollout_max_response_len=32,
                rollout_stop=[], rollout_stop_token_ids=[], reward_key=None, eval_reward_key=None,
                partial_rollout=False, mask_offpolicy_in_partial_rollout=False, rm_type="math",
                custom_rm_path=None, seed=1234)
    base.update(kw)
    return SimpleNamespace(**base)


def _prompts(path: Path, n: int) -> Path:
    import random

    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randint(1, 60), rng.randint(1, 60)
            f.write(json.dumps({"input": f"What is {a} + {b}? Put the answer in \\boxed{{}}.",
                                "label": str(a + b)}) + "\n")
    return path


def _reward() -> Any:
    from pipeline.rewards.dispatch import RewardDispatcher

    return RewardDispatcher(rm_type="math")


async def _raw(engine: Any, prompts: list[list[int]], tokens: int, seeds: list[int],
               batch_invariant: bool = False) -> tuple[int, float]:
    start = time.perf_counter()
    res = await asyncio.gather(*(engine.generate(GenerationRequest(
        f"raw{i}", input_ids=p, sampling=SamplingParams(max_new_tokens=tokens, seed=s,
                                                        batch_invariant=batch_invariant)))
        for i, (p, s) in enumerate(zip(prompts, seeds))))
    return sum(len(r.output_ids) for r in res), time.perf_counter() - start


def _batch_prompts(src_path: Path, tok: Any, groups: int, n: int) -> tuple[list[list[int]], list[int]]:
    src = PlainDataSource(prompt_data=str(src_path), n_samples_per_prompt=n, shuffle=False, label_key="label",
                          apply_chat_template=True, tokenizer=tok)
    ids, seeds = [], []
    for g in src.get_samples(groups):
        for pos, s in enumerate(g):
            ids.append(list(tok(s.prompt, add_special_tokens=False)["input_ids"]))
            seeds.append(sample_seed(1234, s.group_index, pos))
    return ids, seeds


def bench_raw_vs_rollout(engine: Any, data: Path, a: argparse.Namespace, reps: int) -> dict[str, float]:
    """Raw batched generation vs the rollout on the same engine and batch (same seeds). The
    rollout runs in deterministic mode (for the seeds), which asks for batch-invariant
    log-probs, so raw generation does too (`raw`); `raw_batched_logprobs` is raw generation
    without them, the cost of recomputing each sample's log-probs alone."""
    run_sync(engine.generate(GenerationRequest("warm", input_ids=[1, 2, 3],
                                               sampling=SamplingParams(max_new_tokens=4))))
    tok = engine.tokenizer
    prompts, seeds = _batch_prompts(data, tok, a.groups, a.n)
    raw, raw_batched, roll = [], [], []
    rollout = EngineRollout(engine=engine, reward=_reward(), deterministic=True, seed=1234,
                            batch_invariant_log_probs=True, progress=False, summary=False)
    args = _args(rollout_batch_size=a.groups, n_samples_per_prompt=a.n,
                 over_sampling_batch_size=a.groups, rollout_max_response_len=a.tokens)
    for _ in range(reps):
        toks, wall = run_sync(_raw(engine, prompts, a.tokens, seeds, batch_invariant=True))
        raw.append(toks / wall)
        toks, wall = run_sync(_raw(engine, prompts, a.tokens, seeds))
        raw_batched.append(toks / wall)
        src = PlainDataSource(prompt_data=str(data), n_samples_per_prompt=a.n, shuffle=False, label_key="label",
                              apply_chat_template=True, tokenizer=tok)
        start = time.perf_counter()
        out = rollout(args, 0, src)
        roll.append(out.metrics["rollout/tokens_generated"] / (time.perf_counter() - start))
    return {"raw": statistics.median(raw), "rollout": statistics.median(roll),
            "raw_batched_logprobs": statistics.median(raw_batched)}


def bench_overhead(engine: Any, requests: int = 12) -> float:
    """Mean client wall time minus engine busy time of sequential 1-token requests (seconds)."""
    async def go() -> float:
        ids = list(engine.tokenizer("What is 2 + 2?")["input_ids"]) if getattr(engine, "tokenizer", None) \
            else [1, 2, 3, 4, 5, 6, 7, 8]
        await engine.generate(GenerationRequest("w", input_ids=ids, sampling=SamplingParams(max_new_tokens=1)))
        await asyncio.sleep(0.5)  # the engine books a step's busy time just after it returns results
        busy0 = await _busy(engine)
        start = time.perf_counter()
        for i in range(requests):
            await engine.generate(GenerationRequest(f"o{i}", input_ids=ids,
                                                    sampling=SamplingParams(max_new_tokens=1)))
        wall = time.perf_counter() - start
        await asyncio.sleep(0.5)
        return (wall - (await _busy(engine) - busy0)) / requests
    return run_sync(go())


async def _busy(engine: Any) -> float:
    if hasattr(engine, "stats"):
        return sum(s["busy_s"] for s in await engine.stats())
    return engine.busy_s


def bench_ray(model: str, data: Path, a: argparse.Namespace, reps: int) -> dict[str, float]:
    """2 replicas x 1 thread: raw tokens/s on the same batch, per-request overhead."""
    from pipeline.engines.ray_pool import RayEngine
    from pipeline.engines.assets import load_tokenizer

    engine = RayEngine(model, num_replicas=2, threads_per_replica=1, num_cpus=2, max_batch_size=64)
    try:
        run_sync(engine.start())
        tok = load_tokenizer(model)
        prompts, seeds = _batch_prompts(data, tok, a.groups, a.n)
        run_sync(_raw(engine, prompts[:2], 4, seeds[:2]))
        rates = []
        for _ in range(reps):
            toks, wall = run_sync(_raw(engine, prompts, a.tokens, seeds))
            rates.append(toks / wall)
        overhead = bench_overhead(engine)
        return {"raw": statistics.median(rates), "overhead_s": overhead}
    finally:
        engine.close()


def bench_over_sampling(correct_rate: float, rollouts: int = 6) -> list[tuple[str, dict[str, float]]]:
    """Generated tokens per kept group: fixed (1x, 2x batch) vs adaptive (scripted engine)."""
    from pipeline.engines.scripted import ByteTokenizer, ScriptedEngine
    from pipeline.rollout.dynamic_filters import check_reward_nonzero_std

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = _prompts(Path(tmp) / "p.jsonl", 400)
        for label, mode, osb, buffered in (("fixed, osb = batch", "fixed", 8, False),
                                           ("fixed, osb = 2 x batch", "fixed", 16, False),
                                           ("adaptive", "adaptive", 8, False),
                                           ("fixed, osb = 2 x batch, buffered (carry)", "fixed", 16, True),
                                           ("adaptive, buffered (carry)", "adaptive", 8, True)):
            engine = ScriptedEngine(correct_rate=correct_rate, token_delay=0.0005, max_filler=6)
            rollout = EngineRollout(engine=engine, reward=_reward(), tokenizer=ByteTokenizer(),
                                    dynamic_filter=check_reward_nonzero_std, over_sampling=mode,
                                    progress=False, summary=False)
            cls = BufferedDataSource if buffered else PlainDataSource
            src = cls(prompt_data=str(data), n_samples_per_prompt=4, shuffle=False, label_key="label", apply_chat_template=False)
            args = _args(rollout_batch_size=8, n_samples_per_prompt=4, over_sampling_batch_size=osb,
                         rollout_max_response_len=256)
            tokens = fetched = rounds = 0
            start = time.perf_counter()
            for rid in range(rollouts):
                m = rollout(args, rid, src).metrics
                tokens += m["rollout/tokens_generated"]
                fetched += m["rollout/groups_fetched"]
                rounds += m["rollout/fetch_rounds"]
            rows.append((label, {"tokens_per_kept_group": tokens / (8 * rollouts),
                                 "groups_fetched_per_step": fetched / rollouts,
                                 "rounds_per_step": rounds / rollouts,
                                 "pass_rate": rollout.over_sampler.pass_rate,
                                 "s_per_step": (time.perf_counter() - start) / rollouts}))
    return rows


def bench_stages(a: argparse.Namespace) -> dict[str, float]:
    """Run the CLI with the hf engine; mean share of each stage in a rollout step."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(ROOT / "run.py"), "logger=jsonl", "num_rollout=3",
               f"rollout_batch_size={a.groups}", f"n_samples_per_prompt={a.n}",
               f"rollout_max_response_len={a.tokens}", "rollout.progress=false", f"hydra.run.dir={tmp}"]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        steps = [json.loads(line) for line in open(Path(tmp) / "metrics.jsonl")]
    steps = steps[1:] or steps  # the first step includes model load / warm-up
    shares: dict[str, list[float]] = {}
    for m in steps:
        stage = {k: v for k, v in m.items() if k.startswith("perf/stage/")}
        total = sum(stage.values())
        for k, v in stage.items():
            shares.setdefault(k[len("perf/stage/"):-len("_time")], []).append(v / total)
    return {k: statistics.mean(v) for k, v in shares.items()}


def _print_over_sampling() -> None:
    for rate in (0.85, 0.5):
        rows = bench_over_sampling(rate)
        print(f"| over-sampling (scripted engine, nonzero_std, n=4, 6 steps of 8 groups, filter pass "
              f"rate ≈ {rows[2][1]['pass_rate']:.2f}) | generated tokens per kept group | groups "
              f"fetched / step | rounds / step | s / step |\n|---|---|---|---|---|")
        for label, r in rows:
            print(f"| {label} | {r['tokens_per_kept_group']:.0f} | {r['groups_fetched_per_step']:.1f} | "
                  f"{r['rounds_per_step']:.1f} | {r['s_per_step']:.2f} |")
        print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--skip-ray", action="store_true")
    p.add_argument("--skip-cli", action="store_true")
    p.add_argument("--only-over-sampling", action="store_true")
    p.add_argument("--skip-paths", action="store_true")
    p.add_argument("--cli-wall", action="store_true")
    # section 0 (and --cli-wall) also with engine.compile_decode=true
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    from pipeline.engines.hf import HFEngine

    if a.only_over_sampling:
        _print_over_sampling()
        return
    model = resolve_checkpoint("smollm2-135m-instruct", default_cache_dir())
    print(f"# Engine benchmark: batch {a.groups} groups x {a.n} samples, {a.tokens} new tokens, "
          f"{os.cpu_count()} CPUs\n")
    if not a.skip_paths:
        engines = engine_paths.engines(model, compiled=a.compile)
        try:
            prompts = engine_paths.train_prompts(engine_paths.tokenizer_of(engines))
            for group in (1, a.n):  # every request its own prompt; GRPO groups (shared prefill)
                print(f"Batches of {'distinct prompts' if group == 1 else f'{group} samples per prompt'}:\n")
                engine_paths.print_paths(engine_paths.bench_paths(engines, prompts, [1, 8, 32, 64], a.tokens, 2,
                                                                  group))
        finally:
            for e in engines.values():
                e.close()
    if a.cli_wall:
        for label, wall in engine_paths.bench_cli_wall(compiled=a.compile).items():
            print(f"`python run.py`, {label}: {wall:.1f} s (load {os.getloadavg()[0]:.1f})\n")
    with tempfile.TemporaryDirectory() as tmp:
        data = _prompts(Path(tmp) / "p.jsonl", 64)
        # the rollout stage at the default settings of conf/engine/hf.yaml
        engine = HFEngine(model, num_threads=2, **engine_paths.default_engine_kwargs())
        engine.start()
        try:
            rr = bench_raw_vs_rollout(engine, data, a, a.reps)
            inproc_overhead = bench_overhead(engine)
        finally:
            engine.close()
        ray = None if a.skip_ray else bench_ray(model, data, a, a.reps)
    print(f"(load average {os.getloadavg()[0]:.1f})\n")
    print("| measurement | tokens/s | ratio | target |\n|---|---|---|---|")
    print(f"| raw batched generation (hf, 2 threads), batch-invariant log-probs | {rr['raw']:.1f} | 1.00 | |")
    print(f"| rollout stage (EngineRollout + math reward, deterministic) | {rr['rollout']:.1f} | "
          f"{rr['rollout'] / rr['raw']:.2f} | >= 0.90 |")
    print(f"| raw batched generation, log-probs from the batch (not deterministic mode) | "
          f"{rr['raw_batched_logprobs']:.1f} | {rr['raw_batched_logprobs'] / rr['raw']:.2f} | |")
    if ray:
        base = rr["raw_batched_logprobs"]  # the same requests in-process
        print(f"| Ray, 2 replicas x 1 thread (raw, log-probs from the batch) | {ray['raw']:.1f} | "
              f"{ray['raw'] / base:.2f} | >= 0.90 of the row above (overhead {100 * (1 - ray['raw'] / base):.1f}%) |")
        print(f"| per replica (Ray) | {ray['raw'] / 2:.1f} | | |")
        extra = ray["overhead_s"] - inproc_overhead
        batch_wall = a.groups * a.n * a.tokens / ray["raw"]
        print(f"\nRay per-request overhead: {1000 * extra:.1f} ms (client wall minus engine busy time of "
              f"sequential 1-token requests: Ray {1000 * ray['overhead_s']:.1f} ms, in-process "
              f"{1000 * inproc_overhead:.1f} ms). A {a.tokens}-token request in this batch lives "
              f"{1000 * batch_wall:.0f} ms, so dispatch costs {100 * extra / batch_wall:.2f}% of it; "
              f"with replicas on their own cores throughput scales with the replica count "
              f"(≈ {ray['raw'] / 2:.0f} tokens/s each here) until that per-request cost, paid by "
              f"the single dispatching client, approaches the batch time.\n")
    _print_over_sampling()
    if not a.skip_cli:
        shares = bench_stages(a)
        print("\n| stage (CLI, hf engine) | share of a rollout step |\n|---|---|")
        for k, v in sorted(shares.items(), key=lambda kv: -kv[1]):
            print(f"| {k} | {100 * v:.2f}% |")
        other = sum(v for k, v in shares.items() if k != "generate")
        print(f"| **all non-generation stages** | **{100 * other:.2f}%** (target <= 1%) |")


if __name__ == "__main__":
    main()
