"""The per-rollout context the stages read and write, and the parts they use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pipeline.samples.sample import Sample

__all__ = ["RolloutContext", "StageParts"]


@dataclass
class RolloutContext:
    """State of one rollout step as it moves through the stages (docs/contracts.md)."""

    rollout_id: int
    # the nested output of the rollout function (list of groups, possibly deeper for fan-out)
    groups: list[Any] = field(default_factory=list)
    # every group the rollout decided on (kept and dropped by the dynamic filter; the kept groups
    # when the rollout function reports nothing more): what rollout_all_samples_process_path gets
    all_groups: list[Any] = field(default_factory=list)
    # the flat list of samples, after `flatten`
    samples: list[Sample] = field(default_factory=list)
    # slime-keyed train data, after `convert`
    train_data: dict[str, Any] | None = None
    # metrics logged at step rollout_id
    metrics: dict[str, Any] = field(default_factory=dict)
    # seconds per stage name
    timings: dict[str, float] = field(default_factory=dict)
    # metrics the rollout function returned (RolloutFnTrainOutput.metrics)
    extra_metrics: dict[str, Any] = field(default_factory=dict)
    # wall time of the generate stage (seconds)
    rollout_time: float = 0.0
    # (raw_rewards, rewards) from the post-process stage
    raw_rewards: list[Any] = field(default_factory=list)
    rewards: list[Any] = field(default_factory=list)


@dataclass
class StageParts:
    """Everything the stages need besides the context: built once per run by the app."""

    args: Any
    data_source: Any
    rollout_fn: Callable[..., Any]
    # where train data and sample dumps go (None: nothing is written)
    run_dir: str | None = None
    # every plugin built for the run, by slot name (`pipeline.config.plugins.SLOTS`): the hooks (slime's
    # and your own; left out or None: the built-in behaviour runs), the filters, the engine, ...
    plugins: dict[str, Any] = field(default_factory=dict)

    def plugin(self, name: str) -> Any:
        """The plugin of slot `name` (e.g. the hook "rollout_log"), None when none is configured."""
        return self.plugins.get(name)
