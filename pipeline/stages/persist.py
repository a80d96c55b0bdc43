"""Stage: write the rollout's train data and sample dump under the run dir."""

from __future__ import annotations

import logging
import os

from pipeline.sinks.files import write_samples, write_train_data
from pipeline.stages.context import RolloutContext, StageParts

__all__ = ["persist_stage", "samples_path", "train_data_path", "write_failed"]

logger = logging.getLogger(__name__)


def train_data_path(run_dir: str, rollout_id: int) -> str:
    """`<run>/train_data/rollout_<id>` (the loader accepts it with or without a suffix)."""
    return os.path.join(run_dir, "train_data", f"rollout_{rollout_id}")


def samples_path(run_dir: str, rollout_id: int, kind: str = "rollout") -> str:
    """`<run>/samples/<kind>_<id>.jsonl`."""
    return os.path.join(run_dir, "samples", f"{kind}_{rollout_id}.jsonl")


def write_failed(exc: OSError, what: str, rollout_id: int) -> OSError:
    """A clear error for a failed write (disk full, read-only, permissions), logged."""
    target = f" ({exc.filename})" if exc.filename else ""
    msg = (f"writing {what}{target} failed: {exc.strerror or exc}. Nothing of rollout {rollout_id} "
           f"was checkpointed; the previous checkpoint is intact. Free disk space or fix the "
           f"folder's permissions, then resume=<run dir>")
    logger.error(msg)
    return OSError(exc.errno, msg)


def persist_stage(ctx: RolloutContext, parts: StageParts) -> None:
    """Write train data (safetensors + JSON) and the samples (JSONL), both atomically."""
    if parts.run_dir is None:
        return
    data_path, dump_path = train_data_path(parts.run_dir, ctx.rollout_id), samples_path(parts.run_dir, ctx.rollout_id)
    try:
        if ctx.train_data is not None:
            write_train_data(data_path, ctx.train_data, meta={"rollout_id": ctx.rollout_id})
        write_samples(dump_path, ctx.samples)
    except OSError as exc:
        what = f"the train data {data_path}.safetensors/.json or the sample dump {dump_path}"
        raise write_failed(exc, what, ctx.rollout_id) from exc
