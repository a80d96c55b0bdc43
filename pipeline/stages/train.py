"""Stage `train` (after "convert to train data"): the trainer updates the policy, the engine gets
the new weights, the trainer's metrics join the rollout's.

With `trainer=none` (no trainer part) the stage does nothing. The trainer's state is saved with
each data-source checkpoint (`save_trainer`, before the data-source file, so a checkpoint on disk
always has its trainer state) under `<run>/trainer/rollout_<id>/`, keeping the newest
`trainer.keep_states` (`TRAINER_STATES_KEPT` for trainers without that key) and always the state
of the newest data-source checkpoint (`pipeline.train.disk.prune_states`). A resume loads the
state of the checkpoint it continues from and pushes those weights to the engine before the first
rollout (`restore_trainer`). After the last rollout the policy is exported as a plain HF folder
`<run>/policy/` (`export_policy`); a resume with no rollout left to run exports it when it is
missing (the run was killed during the export).
Folders half-written by a killed process (`atomic_dir` temp folders under `<run>/trainer/` and
`<run>/.policy.*`) are removed by the next save or export.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.process.atomic import remove_stale_temp_dirs
from pipeline.stages.context import RolloutContext, StageParts
from pipeline.train.disk import prune_states
from pipeline.train.sync import push_weights

__all__ = ["TRAINER_STATES_KEPT", "export_policy", "policy_missing", "restore_trainer",
           "save_trainer", "sync_trained_weights", "train_stage", "trainer_state_dir"]

logger = logging.getLogger(__name__)

# trainer state folders kept by a trainer without a keep_states attribute (trainer=policy_gradient
# has trainer.keep_states, default 2): two, so that when resume= skips a damaged newest
# checkpoint, the one before it still has its state
TRAINER_STATES_KEPT = 2


def train_stage(ctx: RolloutContext, parts: StageParts) -> None:
    """Train on `ctx.train_data`, push the weights to the engine, add the metrics."""
    trainer = parts.plugin("trainer")
    if trainer is None or ctx.train_data is None:
        return
    ctx.metrics.update(trainer.train(ctx.rollout_id, ctx.train_data))
    ctx.metrics.update(sync_trained_weights(trainer, parts))


def sync_trained_weights(trainer: Any, parts: StageParts) -> dict[str, float]:
    """After an update: the engine gets the trainer's weights (`push_weights`); the sync time and
    `train/weight_version`."""
    metrics = push_weights(trainer, parts.plugin("engine"), parts.run_dir)
    metrics["train/weight_version"] = float(trainer.weight_version)
    return metrics


def trainer_state_dir(run_dir: str, rollout_id: int) -> Path:
    """`<run>/trainer/rollout_<id>`."""
    return Path(run_dir) / "trainer" / f"rollout_{int(rollout_id)}"


def save_trainer(trainer: Any, run_dir: str, rollout_id: int) -> None:
    """Write the trainer state of `rollout_id`, after removing the half-written ones of a killed
    process; older states beyond the newest `trainer.keep_states` go, before the write (so at
    most keep_states + 1 are on disk) and after it, but never the newest data-source
    checkpoint's (`prune_states`)."""
    root = Path(run_dir) / "trainer"
    for stale in remove_stale_temp_dirs(root, "rollout_*"):
        logger.info("removed the half-written trainer state %s (left by a killed run)", stale)
    keep = int(getattr(trainer, "keep_states", TRAINER_STATES_KEPT))
    prune_states(run_dir, keep, writing=rollout_id)
    trainer.save(str(trainer_state_dir(run_dir, rollout_id)))
    prune_states(run_dir, keep, writing=rollout_id)


def restore_trainer(trainer: Any, engine: Any, run_dir: str, rollout_id: int) -> None:
    """Load the trainer state saved with checkpoint `rollout_id` and push its weights to the engine."""
    folder = trainer_state_dir(run_dir, rollout_id)
    if not folder.is_dir():
        if not folder.parent.is_dir():  # the run had no trainer until now (allow_config_change=true)
            logger.warning("resume: %s has no trainer state (the run so far had no trainer); the trainer starts "
                           "from hf_checkpoint at weight version 0", run_dir)
            return
        raise FileNotFoundError(
            f"resume: {folder} is missing: checkpoint rollout_{rollout_id} has no trainer state (the trainer "
            f"states kept are {sorted(p.name for p in folder.parent.iterdir())})")
    trainer.load(str(folder))
    if trainer.weight_version > 0:
        push_weights(trainer, engine, run_dir)


def export_policy(trainer: Any, run_dir: str) -> None:
    """The final policy as a plain HF folder `<run>/policy/` (trainers that can export)."""
    export = getattr(trainer, "export_hf", None)
    if callable(export):
        for stale in remove_stale_temp_dirs(run_dir, "policy"):
            logger.info("removed the half-written policy export %s (left by a killed run)", stale)
        folder = export(str(Path(run_dir) / "policy"))
        logger.info("final policy written to %s", folder)


def policy_missing(trainer: Any, run_dir: str) -> bool:
    """A trained policy (weight version > 0) that can be exported but has no `<run>/policy/` yet:
    a resume after a kill during the export has no rollout left to run and still owes it."""
    return (callable(getattr(trainer, "export_hf", None)) and int(trainer.weight_version) > 0
            and not (Path(run_dir) / "policy").is_dir())
