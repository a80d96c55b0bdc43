"""Stage: flatten the nested rollout output into one list of samples (docs/contracts.md §7)."""

from __future__ import annotations

from typing import Any

from pipeline.rollout.contracts import PluginOutputError, is_sample_like
from pipeline.samples.sample import Sample
from pipeline.stages.context import RolloutContext, StageParts

__all__ = ["flatten_samples", "flatten_stage"]


def flatten_samples(output: list[Any], where: str = "rollout function") -> list[Sample]:
    """Repeatedly flatten lists until a flat list of samples; empty output is an error."""
    flat: list[Any] = []
    stack: list[tuple[Any, str]] = [(output, "samples")]
    # depth-first, left to right: keeps the rollout's order
    while stack:
        node, pos = stack.pop()
        if isinstance(node, (list, tuple)):
            stack.extend(reversed([(x, f"{pos}[{i}]") for i, x in enumerate(node)]))
        elif is_sample_like(node):
            flat.append(node)
        else:
            raise PluginOutputError(f"{where}: {pos} is {type(node).__name__}, expected a Sample or a list")
    if not flat:
        raise PluginOutputError(f"{where} returned no samples (empty output); expected at least one group")
    return flat


def flatten_stage(ctx: RolloutContext, parts: StageParts) -> None:
    """Stage wrapper of `flatten_samples`."""
    ctx.samples = flatten_samples(ctx.groups)
