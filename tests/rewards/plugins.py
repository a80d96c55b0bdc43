"""Reward functions used by the dispatcher tests (referenced by dotted path)."""

from __future__ import annotations

from typing import Any

CALLS: list[tuple[str, Any]] = []


async def length_reward(args: Any, sample: Any) -> float:
    """Per-sample: the response length."""
    CALLS.append(("length", sample.index))
    return float(len(sample.response))


def sync_constant(args: Any, sample: Any) -> float:
    """A sync per-sample function."""
    return 7.0


async def group_rank(args: Any, samples: list[Any]) -> list[float]:
    """Group mode: rank within the list (1.0 for the longest response)."""
    CALLS.append(("group", [s.index for s in samples]))
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].response))
    return [order.index(i) / max(1, len(samples) - 1) for i in range(len(samples))]


async def bad_group(args: Any, samples: list[Any]) -> list[float]:
    """Returns one reward too few."""
    return [0.0] * (len(samples) - 1)
