"""Replay: re-serve the sample dumps of an earlier run (`<run>/samples/rollout_<id>.jsonl`).

Useful to re-run reward post-processing / conversion / logging changes on fixed generations.
Dumps are JSON (no pickle); samples regroup by `group_index`, in dump order.
"""

from __future__ import annotations

import os
from typing import Any

from pipeline.rollout.contracts import RolloutFnTrainOutput
from pipeline.sinks.files import read_samples

__all__ = ["ReplayRollout"]


class ReplayRollout:
    """`rollout(args, rollout_id, data_source)` -> the groups dumped at rollout_id + offset."""

    def __init__(self, source_dir: str | None, offset: int = 0) -> None:
        if not source_dir:
            raise ValueError("rollout=replay needs rollout.source_dir=<an earlier run dir>")
        if not os.path.isdir(os.path.join(source_dir, "samples")):
            raise FileNotFoundError(f"rollout.source_dir: {source_dir!r} has no samples/ folder (not a run dir?)")
        self.source_dir = source_dir
        self.offset = int(offset)

    def __call__(self, args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> RolloutFnTrainOutput:
        """Load and regroup the dump of rollout `rollout_id + offset`."""
        if evaluation:
            raise ValueError("rollout=replay has no eval branch; use eval=none")
        path = os.path.join(self.source_dir, "samples", f"rollout_{rollout_id + self.offset}.jsonl")
        if not os.path.exists(path):
            raise FileNotFoundError(f"rollout=replay: {path} does not exist (the earlier run has no such rollout)")
        groups: dict[Any, list[Any]] = {}
        for i, sample in enumerate(read_samples(path)):
            key = sample.group_index if sample.group_index is not None else ("solo", i)
            groups.setdefault(key, []).append(sample)
        return RolloutFnTrainOutput(samples=list(groups.values()))
