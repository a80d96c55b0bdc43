"""Stage: write the rollout's train data and sample dump under the run dir."""

from __future__ import annotations

import os

from pipeline.sinks.files import write_samples, write_train_data
from pipeline.stages.context import RolloutContext, StageParts

__all__ = ["persist_stage", "samples_path", "train_data_path"]


def train_data_path(run_dir: str, rollout_id: int) -> str:
    """`<run>/train_data/rollout_<id>` (the loader accepts it with or without a suffix)."""
    return os.path.join(run_dir, "train_data", f"rollout_{rollout_id}")


def samples_path(run_dir: str, rollout_id: int, kind: str = "rollout") -> str:
    """`<run>/samples/<kind>_<id>.jsonl`."""
    return os.path.join(run_dir, "samples", f"{kind}_{rollout_id}.jsonl")


def persist_stage(ctx: RolloutContext, parts: StageParts) -> None:
    """Write train data (safetensors + JSON) and the samples (JSONL), both atomically."""
    if parts.run_dir is None:
        return
    if ctx.train_data is not None:
        write_train_data(train_data_path(parts.run_dir, ctx.rollout_id), ctx.train_data,
                         meta={"rollout_id": ctx.rollout_id})
    write_samples(samples_path(parts.run_dir, ctx.rollout_id), ctx.samples)
