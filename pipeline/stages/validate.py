"""Stage: check group sizes and the rollout_id consistency of fan-out siblings (docs/contracts.md §7)."""

from __future__ import annotations

from typing import Any

from pipeline.rollout.contracts import is_sample_like
from pipeline.stages.context import RolloutContext, StageParts

__all__ = ["GroupSizeError", "RolloutIdError", "check_group_sizes", "check_rollout_ids", "validate_stage"]


class RolloutIdError(ValueError):
    """Fan-out siblings disagree on (or lack) their rollout_id."""


def check_rollout_ids(output: list[Any]) -> None:
    """Walk the nested output; a list of samples at depth >= 2 with more than one element must
    have every rollout_id set and all equal. Depth-1 groups (output[i]) are free."""
    problems: list[str] = []

    def walk(node: Any, depth: int, pos: str) -> None:
        if not isinstance(node, list):
            return
        leaves = [(i, x) for i, x in enumerate(node) if is_sample_like(x)]
        if depth >= 2 and len(node) > 1 and leaves:
            ids = [x.rollout_id for _, x in leaves]
            unset = [f"{pos}[{i}]" for i, x in leaves if x.rollout_id is None]
            if unset:
                problems.append(f"fan-out at {pos}: rollout_id unset at {', '.join(unset)}")
            elif len(set(ids)) > 1:
                detail = ", ".join(f"{pos}[{i}]={x.rollout_id}" for i, x in leaves)
                problems.append(f"fan-out at {pos}: rollout_ids differ ({detail})")
        for i, child in enumerate(node):
            walk(child, depth + 1, f"{pos}[{i}]")

    walk(output, 0, "samples")
    if problems:
        raise RolloutIdError(
            "fan-out siblings must share one Sample.rollout_id:\n  " + "\n  ".join(problems)
        )


def check_group_sizes(output: list[Any], n_samples_per_prompt: int) -> None:
    """Each top-level group that is a flat list of samples holds `n_samples_per_prompt` of them
    (fan-out groups, with nested lists, are free). An output without samples is left to `flatten`."""
    if not any(isinstance(g, list) and g for g in output):
        return
    for i, group in enumerate(output):
        if not isinstance(group, list) or any(isinstance(x, list) for x in group):
            continue
        if len(group) != n_samples_per_prompt:
            raise GroupSizeError(
                f"rollout function: group samples[{i}] has {len(group)} samples; expected "
                f"n_samples_per_prompt={n_samples_per_prompt} (one group per prompt, list[list[Sample]])")


class GroupSizeError(ValueError):
    """A group of the rollout output has the wrong number of samples."""


def validate_stage(ctx: RolloutContext, parts: StageParts) -> None:
    """Stage wrapper of `check_group_sizes` and `check_rollout_ids`."""
    # a stand-in args namespace (unit tests) may not carry n_samples_per_prompt: no size check then
    n = getattr(parts.args, "n_samples_per_prompt", None)
    if isinstance(n, int):
        check_group_sizes(ctx.groups, n)
    check_rollout_ids(ctx.groups)
