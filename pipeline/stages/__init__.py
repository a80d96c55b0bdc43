"""Per-rollout stages (docs/contracts.md §7): each is `stage(ctx, parts) -> None`, run in `STAGES` order."""

from pipeline.stages.rewards import rewards_stage
from pipeline.stages.context import RolloutContext, StageParts
from pipeline.stages.flatten import flatten_stage
from pipeline.stages.generate import generate_stage, sample_filter_stage
from pipeline.stages.log import log_stage
from pipeline.stages.persist import persist_stage
from pipeline.stages.train import train_stage
from pipeline.stages.train_data import train_data_stage
from pipeline.stages.validate import validate_stage

__all__ = ["RolloutContext", "StageParts", "STAGES"]

# (name, stage); the runner times each as perf/stage/<name>_time
STAGES = (
    ("generate", generate_stage),
    ("sample_filter", sample_filter_stage),
    ("validate", validate_stage),
    ("flatten", flatten_stage),
    ("rewards", rewards_stage),
    ("train_data", train_data_stage),
    ("train", train_stage),
    ("persist", persist_stage),
    ("log", log_stage),
)
