"""Distributed trainer benchmark (`make bench-distributed`; not in CI): the one-process trainer
against N torch.distributed workers on this machine, side by side in one run, on the same train
data (a real `experiment=learn` rollout of SmolLM2-135M-Instruct: 8 prompts x 4 samples).

Cases (each in processes of its own, alternated `--repeat` times):
- `one`: `trainer.num_workers=1`, `trainer.num_threads=<cores>` (a subprocess of its own);
- `fsdp2` / `ddp`: `trainer.num_workers=<workers>`, `trainer.num_threads=<cores / workers>`;
- `fsdp2-native`: fsdp2 with gloo's own all-gather and reduce-scatter
  (`trainer.gloo_collectives=native`; the default `broadcast` uses gloo's broadcast and all-reduce);
- `fsdp2-fast`: fsdp2 trading memory for speed: parameters kept gathered from a micro-batch's
  first forward to its backward (`trainer.fsdp_reshard_after_forward=false`) and glibc's caching
  of freed memory (`trainer.release_freed_memory=false`);
- `fsdp2-bf16`: fsdp2 with `trainer.param_dtype=bfloat16` (half the bytes of each all-gather)
  and `trainer.fsdp_reshard_after_forward=false` (one all-gather per micro-batch);
- `fsdp2-bf16-reshard`: bfloat16 parameters, resharded after each forward (the least memory);
- `fsdp2-kept`: fsdp2 with `trainer.release_freed_memory=false` (glibc keeps freed memory, as
  the one process does);
- `fsdp2-small-pages`: fsdp2 whose workers release freed memory in 4 KB pages (started with
  `GLIBC_TUNABLES=glibc.malloc.hugetlb=0` instead of the huge pages of `malloc.release_env`);
- `one-released`: the one process under the workers' malloc policy (`pipeline.process.malloc.
  release_freed_memory`, huge pages included), so that the memory ratio can also be read with
  the same allocator on both sides (`peak_rss_ratio_worker_over_one_released`).
Reported: seconds per optimizer step (median of the steps after the first), the ratio
one / distributed (issue 29 expects >= 0.7 with 2 workers x 1 thread on 2 cores: the point is
scale, not speed on 2 cores), peak RSS of the one process and of each worker, their ratio (target
<= 0.6 for FSDP2: parameters, gradients and AdamW state are sharded), the weight gather for the
engine (seconds, and the peak RSS of rank 0 during it) and whether the losses agree.

Usage: python bench/distributed.py [--steps 4] [--workers 2] [--repeat 2] [--cases one fsdp2 ddp]
       [--override KEY=VALUE ...] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# case -> (strategy, its own overrides)
CASES: dict[str, tuple[str, list[str]]] = {
    "fsdp2": ("fsdp2", []), "ddp": ("ddp", []),
    "fsdp2-native": ("fsdp2", ["trainer.gloo_collectives=native"]),
    "fsdp2-fast": ("fsdp2", ["trainer.fsdp_reshard_after_forward=false", "trainer.release_freed_memory=false"]),
    "fsdp2-bf16": ("fsdp2", ["trainer.param_dtype=bfloat16", "trainer.fsdp_reshard_after_forward=false"]),
    "fsdp2-bf16-reshard": ("fsdp2", ["trainer.param_dtype=bfloat16"]),
    "fsdp2-kept": ("fsdp2", ["trainer.release_freed_memory=false"]),
    "fsdp2-small-pages": ("fsdp2", []),
}
# case -> environment of its own: the default fsdp2 workers without huge pages (the user's
# GLIBC_TUNABLES wins over `malloc.release_env`), to show what they buy
CASE_ENV: dict[str, dict[str, str]] = {"fsdp2-small-pages": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}}
ONE_CASES = ("one", "one-released")


def rollout_data(out_dir: Path) -> Path:
    """One experiment=learn rollout's train data, generated once (no trainer)."""
    run = out_dir / "rollout"
    if not (run / "train_data" / "rollout_0.json").exists():
        subprocess.run([sys.executable, "run.py", "experiment=learn", "trainer=none", "num_rollout=1",
                        "eval_before_train=false", "eval_interval=null", "logger=jsonl", "rollout.progress=false",
                        "dynamic_filter=none", f"hydra.run.dir={run}"], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
    return run / "train_data" / "rollout_0"


def trainer_keys(overrides: list[str], **extra: Any) -> dict[str, Any]:
    """conf/trainer/policy_gradient.yaml under experiment=learn, resolved, plus `extra`."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=learn", *overrides])
    from omegaconf import OmegaConf

    keys = OmegaConf.to_container(cfg.trainer, resolve=True)
    keys.pop("_target_")
    keys.update(extra)
    return keys


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def child_one(a: argparse.Namespace) -> None:
    """The one-process trainer (run as a subprocess): JSON on stdout."""
    import torch

    from pipeline import load_train_data

    from pipeline.process import malloc
    from pipeline.train.policy_gradient import PolicyGradientTrainer

    if a.release:
        print(malloc.release_freed_memory(), file=sys.stderr)
    data = load_train_data(a.data)
    t = PolicyGradientTrainer(**trainer_keys(a.override, num_workers=1, num_threads=os.cpu_count() or 1))
    times, losses = [], []
    for step in range(a.steps):
        start = time.perf_counter()
        losses.append(t.train(step, data)["train/loss"])
        times.append(time.perf_counter() - start)
    before = peak_rss_mb()
    start = time.perf_counter()
    weights = t.weights_for_engine()
    gather = time.perf_counter() - start
    del weights
    torch.set_num_threads(1)
    print(json.dumps({"step_s": times, "losses": losses, "peak_rss_mb": [before], "gather_s": gather}))


def run_distributed(a: argparse.Namespace, strategy: str) -> dict[str, Any]:
    """N workers in this process's Ray (a fresh local one per case)."""
    import ray

    from pipeline import load_train_data
    from pipeline.config.args import SlimeArgs
    from pipeline.train.build import policy_gradient_trainer

    data = load_train_data(a.data)
    threads = max(1, (os.cpu_count() or 1) // a.workers)
    keys = trainer_keys(a.override, num_workers=a.workers, strategy=strategy, num_threads=threads)
    t = policy_gradient_trainer(args=SlimeArgs({"paths": {"output_dir": "bench"}, "resume": None}), **keys)
    try:
        times, losses = [], []
        for step in range(a.steps):
            start = time.perf_counter()
            losses.append(t.train(step, data)["train/loss"])
            times.append(time.perf_counter() - start)
        rss = t.group.call("peak_rss_mb")
        start = time.perf_counter()
        weights = t.weights_for_engine()
        gather = time.perf_counter() - start
        del weights
        rss_after_gather = t.group.call("peak_rss_mb")
    finally:
        t.close()
        if ray.is_initialized():
            ray.shutdown()
    return {"step_s": times, "losses": losses, "peak_rss_mb": rss, "gather_s": gather,
            "rank0_peak_rss_after_gather_mb": rss_after_gather[0]}


def run_case(a: argparse.Namespace, case: str) -> dict[str, Any]:
    from pipeline.process import malloc

    if case in ONE_CASES:
        cmd = [sys.executable, __file__, "--child-one", "--data", str(a.data), "--steps", str(a.steps)]
        cmd += ["--release"] if case == "one-released" else []
        cmd += [x for o in a.override for x in ("--override", o)]
        # the workers' policy whole: their huge-page tunable too (glibc reads it at start)
        env = {**os.environ, **(malloc.release_env(os.environ) if case == "one-released" else {})}
        out = subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True, env=env).stdout
        return json.loads(out.strip().splitlines()[-1])
    strategy, extra = CASES[case]
    cmd = [sys.executable, __file__, "--child-distributed", strategy, "--data", str(a.data), "--steps", str(a.steps),
           "--workers", str(a.workers)] + [x for o in [*a.override, *extra] for x in ("--override", o)]
    env = {**os.environ, **CASE_ENV.get(case, {})}
    out = subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def summary(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def step(r: dict[str, Any]) -> float:
        return statistics.median(r["step_s"][1:] or r["step_s"])

    out: dict[str, Any] = {}
    one = results.get("one", [])
    released = results.get("one-released", [])
    for case, runs in results.items():
        s = statistics.median(step(r) for r in runs)
        row: dict[str, Any] = {"s_per_step": round(s, 3), "peak_rss_mb": [round(x) for x in runs[-1]["peak_rss_mb"]],
                               "gather_s": round(runs[-1]["gather_s"], 3), "losses": runs[-1]["losses"]}
        if case not in ONE_CASES and released:
            row["peak_rss_ratio_worker_over_one_released"] = round(
                max(runs[-1]["peak_rss_mb"]) / released[-1]["peak_rss_mb"][0], 3)
        if case not in ONE_CASES and one:
            base = statistics.median(step(r) for r in one)
            row["speed_ratio_one_over_this"] = round(base / s, 3)
            row["peak_rss_ratio_worker_over_one"] = round(max(runs[-1]["peak_rss_mb"]) / one[-1]["peak_rss_mb"][0], 3)
            row["max_loss_rel_diff_vs_one"] = max(abs(x - y) / max(abs(y), 1e-12)
                                                  for x, y in zip(runs[-1]["losses"], one[-1]["losses"]))
        if "rank0_peak_rss_after_gather_mb" in runs[-1]:
            row["rank0_peak_rss_after_gather_mb"] = round(runs[-1]["rank0_peak_rss_after_gather_mb"])
        out[case] = row
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--cases", nargs="+", default=["one", "one-released", "fsdp2", "fsdp2-fast", "fsdp2-native", "ddp"],
                   choices=[*ONE_CASES, *CASES])
    p.add_argument("--override", action="append", default=[], help="a config override, e.g. trainer.bf16=false")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--child-one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--release", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-distributed", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child_one:
        return child_one(a)
    if a.child_distributed:
        print(json.dumps(run_distributed(a, a.child_distributed)))
        return None
    a.data = a.data or rollout_data(Path(tempfile.gettempdir()) / "bench_distributed")
    results: dict[str, list[dict[str, Any]]] = {}
    for _ in range(a.repeat):
        for case in a.cases:
            results.setdefault(case, []).append(run_case(a, case))
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": _cpu(), "cores": os.cpu_count(),
              "workers": a.workers, "steps": a.steps, "overrides": a.override, "cases": summary(results)}
    text = json.dumps(report, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text)
    return None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
