"""Plugin output types and their shape-based normalisation (docs/contracts.md §6, §8).

Outputs are accepted by shape, not by class: slime's own `RolloutFnTrainOutput`,
`RolloutFnEvalOutput`, `DynamicFilterOutput` and `Sample` work as well as ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.samples.sample import Sample

__all__ = [
    "RolloutFnTrainOutput",
    "RolloutFnEvalOutput",
    "DynamicFilterOutput",
    "PluginOutputError",
    "as_train_output",
    "as_eval_output",
    "as_filter_output",
    "is_sample_like",
]


class PluginOutputError(TypeError):
    """A plugin returned something of the wrong shape."""


@dataclass
class RolloutFnTrainOutput:
    """Train branch of a rollout function: groups of samples plus optional metrics, and (ours,
    optional) every group it decided on, dropped ones too, for rollout_all_samples_process_path."""

    samples: list[list[Sample]]
    metrics: dict[str, Any] | None = None
    all_samples: list[list[Sample]] | None = None


@dataclass
class RolloutFnEvalOutput:
    """Eval branch: `{dataset: {"rewards": [...], "truncated": [...], "samples": [...]}}`."""

    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None


@dataclass
class DynamicFilterOutput:
    """Verdict of a dynamic filter on one finished group."""

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


def is_sample_like(obj: Any) -> bool:
    """True for our Sample and for any object with Sample's core fields (e.g. slime's)."""
    if isinstance(obj, Sample):
        return True
    return all(hasattr(obj, name) for name in ("index", "tokens", "response_length", "status", "reward"))


def as_train_output(value: Any, where: str) -> RolloutFnTrainOutput:
    """Wrap a bare list, or re-wrap any object with `.samples` (+ `.metrics`)."""
    if isinstance(value, RolloutFnTrainOutput):
        return value
    if isinstance(value, list):
        return RolloutFnTrainOutput(samples=value)
    if hasattr(value, "samples"):
        return RolloutFnTrainOutput(samples=value.samples, metrics=getattr(value, "metrics", None),
                                    all_samples=getattr(value, "all_samples", None))
    raise PluginOutputError(
        f"{where} returned {type(value).__name__}; expected RolloutFnTrainOutput(samples=..., "
        f"metrics=...) or a list of groups (list[list[Sample]])"
    )


def as_eval_output(value: Any, where: str) -> RolloutFnEvalOutput:
    """Wrap a bare dict, or re-wrap any object with `.data` (+ `.metrics`)."""
    if isinstance(value, RolloutFnEvalOutput):
        return value
    if isinstance(value, dict):
        return RolloutFnEvalOutput(data=value)
    if hasattr(value, "data"):
        return RolloutFnEvalOutput(data=value.data, metrics=getattr(value, "metrics", None))
    raise PluginOutputError(
        f"{where} returned {type(value).__name__}; expected RolloutFnEvalOutput(data=..., "
        f"metrics=...) or a dict {{dataset_name: {{'rewards', 'truncated', 'samples'}}}}"
    )


def as_filter_output(value: Any, where: str) -> DynamicFilterOutput:
    """Accept a bare bool or any object with `.keep` (+ reason, keep_when_insufficient)."""
    if isinstance(value, DynamicFilterOutput):
        return value
    if isinstance(value, bool):
        return DynamicFilterOutput(keep=value)
    if hasattr(value, "keep"):
        return DynamicFilterOutput(
            keep=bool(value.keep),
            reason=getattr(value, "reason", None),
            keep_when_insufficient=bool(getattr(value, "keep_when_insufficient", False)),
        )
    raise PluginOutputError(
        f"{where} returned {type(value).__name__}; expected a bool or DynamicFilterOutput(keep=...)"
    )
