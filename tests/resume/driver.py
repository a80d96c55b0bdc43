"""Runs `run.py` with named pause points, so the resume harness can SIGKILL at a chosen moment.

Usage: `python tests/resume/driver.py <hydra overrides>`. With `RESUME_MARKS=<file>` set, each
named point appends a line `<point> <n>` (n: how often it was reached in this process) to that
file and then sleeps `RESUME_PAUSE` seconds (default 0), leaving the harness a window to kill
the process exactly there; with `RESUME_PAUSE_AT=<point>` it pauses at that point only. Points:

- `generate`: a scripted-engine request starts
- `reward`: a reward call starts
- `persist`: a train-data / sample dump is about to be renamed into place (temp file written)
- `checkpoint`: a data-source checkpoint is about to be renamed into place (temp file written,
  the previous checkpoint still the newest)
- `committed`: a data-source checkpoint was just renamed into place, its rollout's metrics line
  not yet written
- `train`: the trainer has accumulated one optimizer step's gradients (trainer=policy_gradient;
  earlier steps of the same rollout already changed the weights in memory)
- `trainer_state`: a file is renamed under `<run>/trainer/`: the first of each save is
  `trainer_state.json` inside the half-written temp folder, the second the complete folder
  `rollout_<id>` itself
- `export`: the exported policy folder `<run>/policy` is about to be renamed into place
- `distributed_train`: the driver of N trainer workers (trainer.num_workers > 1) is about to
  send a rollout's shares to its workers (a harness kills a worker process there)

The patches live only in this test driver; the pipeline has no test hooks.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_COUNTS: Counter[str] = Counter()


def mark(point: str) -> float:
    """Record that `point` was reached; returns the pause (seconds) to take there."""
    marks = os.environ.get("RESUME_MARKS")
    if not marks:
        return 0.0
    _COUNTS[point] += 1
    with open(marks, "a", encoding="utf-8") as f:
        f.write(f"{point} {_COUNTS[point]}\n")
        f.flush()
        os.fsync(f.fileno())
    only = os.environ.get("RESUME_PAUSE_AT")
    if only and point != only:
        return 0.0
    return float(os.environ.get("RESUME_PAUSE", "0") or 0)


def install() -> None:
    """Wrap the engine, the reward dispatcher, the trainer's step and os.replace with `mark` calls."""
    import asyncio

    from pipeline.engines.scripted import ScriptedEngine
    from pipeline.rewards.dispatch import RewardDispatcher
    from pipeline.train.distributed.driver import DistributedTrainer
    from pipeline.train.policy_gradient import PolicyGradientTrainer

    real_generate, real_score, real_replace = ScriptedEngine.generate, RewardDispatcher.score, os.replace
    real_accumulate = PolicyGradientTrainer.accumulate
    real_distributed_train = DistributedTrainer.train

    def distributed_train(self, rollout_id, train_data):  # type: ignore[no-untyped-def]
        time.sleep(mark("distributed_train"))
        return real_distributed_train(self, rollout_id, train_data)

    async def generate(self, request):  # type: ignore[no-untyped-def]
        await asyncio.sleep(mark("generate"))
        return await real_generate(self, request)

    async def score(self, args, samples):  # type: ignore[no-untyped-def]
        await asyncio.sleep(mark("reward"))
        return await real_score(self, args, samples)

    def accumulate(self, prepared, indices, backward):  # type: ignore[no-untyped-def]
        out = real_accumulate(self, prepared, indices, backward)
        if backward:
            time.sleep(mark("train"))
        return out

    def replace(src, dst, *a, **kw):  # type: ignore[no-untyped-def]
        d = str(dst)
        point = "checkpoint" if f"{os.sep}checkpoints{os.sep}" in d else \
            "persist" if f"{os.sep}train_data{os.sep}" in d or f"{os.sep}samples{os.sep}" in d else \
            "trainer_state" if f"{os.sep}trainer{os.sep}" in d else \
            "export" if os.path.basename(d) == "policy" else None
        if point is not None:
            time.sleep(mark(point))
        out = real_replace(src, dst, *a, **kw)
        if point == "checkpoint":
            time.sleep(mark("committed"))
        return out

    ScriptedEngine.generate = generate  # type: ignore[method-assign]
    RewardDispatcher.score = score  # type: ignore[method-assign]
    PolicyGradientTrainer.accumulate = accumulate  # type: ignore[method-assign]
    DistributedTrainer.train = distributed_train  # type: ignore[method-assign]
    os.replace = replace  # type: ignore[assignment]


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    install()
    import runpy

    sys.argv = [str(ROOT / "run.py"), *sys.argv[1:]]
    runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
