"""Dynamic filters: `fn(args, samples, **kwargs) -> DynamicFilterOutput | bool`, called on each
finished group during over-sampling; dropped groups are counted as
`rollout/dynamic_filter/drop_<reason>` in metrics.jsonl.

slime form:   dynamic_filter.path=examples.dynamic_filter.drop_all_wrong
native form:  dynamic_filter=too_easy   (examples/conf/dynamic_filter/too_easy.yaml)
"""

from __future__ import annotations

from typing import Any

from pipeline.rollout.contracts import DynamicFilterOutput

__all__ = ["DropTooEasy", "drop_all_wrong"]


def _correct(args: Any, samples: list[Any]) -> list[bool]:
    return [float(s.get_reward_value(args)) > 0 for s in samples]


def drop_all_wrong(args: Any, samples: list[Any], **kwargs: Any) -> DynamicFilterOutput:
    """Drop a group in which no sample got a positive reward (reason `all_wrong`)."""
    keep = any(_correct(args, samples))
    return DynamicFilterOutput(keep=keep, reason=None if keep else "all_wrong")


class DropTooEasy:
    """Drop a group when more than `max_correct_fraction` of its samples are right (reason
    `too_easy`); with `keep_when_insufficient` a dropped group still fills a short batch."""

    def __init__(self, max_correct_fraction: float = 0.75, keep_when_insufficient: bool = False) -> None:
        if not 0.0 <= max_correct_fraction <= 1.0:
            raise ValueError(f"dynamic_filter.max_correct_fraction: expected 0..1, got {max_correct_fraction}")
        self.max_correct_fraction = max_correct_fraction
        self.keep_when_insufficient = keep_when_insufficient

    def __call__(self, args: Any, samples: list[Any], **kwargs: Any) -> DynamicFilterOutput:
        """The verdict on one finished group."""
        correct = _correct(args, samples)
        keep = sum(correct) / len(correct) <= self.max_correct_fraction
        return DynamicFilterOutput(keep=keep, reason=None if keep else "too_easy",
                                   keep_when_insufficient=self.keep_when_insufficient)
