"""Buffer filters: `fn(args, rollout_id, buffer, num_samples) -> list[list[Sample]]`.

A filter returns at most `num_samples` groups and removes what it returns from `buffer`
(in place). Any function with that signature works; stateful filters are callables with
`state_dict()` / `load_state_dict()`, and the data source checkpoints their state.
`left_in_buffer` finds returned samples a filter did not remove (the buffered source warns the
first time and fails when it would hand such a group out again).
"""

from __future__ import annotations

import logging
from typing import Any

from pipeline.config.plugins import Needs
from pipeline.samples.versions import group_staleness, serving_version

__all__ = ["pop_first", "reward_topk", "OldestFirst", "oldest_first", "group_mean_reward", "NEEDS_BUFFER",
           "left_in_buffer", "REMOVE_HINT"]

# what a filter that ranks or drops buffered groups declares (`plugin_requires`): pop_first
# declares nothing, it works on any source
NEEDS_BUFFER = (Needs("data_source", "buffer", "data_source=buffered (or filter=pop_first)"),)

logger = logging.getLogger(__name__)


# what the error for a filter that leaves its groups in the buffer tells the user to do
REMOVE_HINT = ("a buffer filter must remove the groups it returns from `buffer` (in place: `del buffer[:n]`, "
               "`buffer.remove(group)` or `buffer[:] = rest`, as slime's pop_first does); otherwise every "
               "rollout serves the same groups again and the buffer only grows")


def left_in_buffer(groups: list[list[Any]], buffer: list[list[Any]]) -> list[list[Any]]:
    """The returned `groups` that still have a sample in `buffer` (by identity: the filter did not
    remove them); empty for a filter that keeps the contract."""
    buffered = {id(s) for group in buffer for s in group}
    return [group for group in groups if any(id(s) in buffered for s in group)]


def pop_first(args: Any, rollout_id: int | None, buffer: list[list[Any]], num_samples: int) -> list[list[Any]]:
    """FIFO: the `num_samples` oldest groups (slime's default filter)."""
    n = min(len(buffer), num_samples)
    out = buffer[:n]
    del buffer[:n]
    return out


def group_mean_reward(args: Any, group: list[Any]) -> float | None:
    """Mean of `get_reward_value(args)` over the group; None when any sample has no reward."""
    values = []
    for s in group:
        r = s.get_reward_value(args) if hasattr(s, "get_reward_value") else s.reward
        if r is None:
            return None
        values.append(float(r))
    return sum(values) / len(values) if values else None


def reward_topk(args: Any, rollout_id: int | None, buffer: list[list[Any]], num_samples: int) -> list[list[Any]]:
    """Groups with the highest mean reward first; groups without a reward rank last (FIFO ties)."""
    means = [group_mean_reward(args, g) for g in buffer]
    ranked = sorted(range(len(buffer)), key=lambda i: (means[i] is None, -(means[i] or 0.0), i))
    chosen = ranked[:num_samples]
    out = [buffer[i] for i in chosen]
    taken = set(chosen)
    buffer[:] = [g for i, g in enumerate(buffer) if i not in taken]
    return out


def _start_rollout_id(group: list[Any]) -> int | None:
    starts = [s.metadata.get("start_rollout_id") for s in group
              if isinstance(getattr(s, "metadata", None), dict)]
    starts = [x for x in starts if x is not None]
    return min(starts) if starts else None


class OldestFirst:
    """Oldest `metadata["start_rollout_id"]` first; groups staler than `max_staleness` weight
    versions are dropped.

    A group is stale when the weight version the engine serves now (`pipeline.samples.versions.
    serving_version()`, published by the rollout) minus the oldest version among its tokens
    exceeds `max_staleness`; with weights that never change nothing is stale. Dropped groups
    are counted in `dropped` (checkpointed with the data source). Groups that never started
    (no start_rollout_id) rank after started ones, in buffer order.
    """

    plugin_requires = NEEDS_BUFFER

    # the default is conf/filter/oldest_first.yaml's, for slime's form: `buffer_filter_path` names
    # the class and the data source builds it without arguments
    def __init__(self, max_staleness: int | None = 2) -> None:
        if max_staleness is not None and (not isinstance(max_staleness, int) or max_staleness < 0):
            raise ValueError(f"oldest_first: max_staleness must be a non-negative int or None, got {max_staleness!r}")
        self.max_staleness = max_staleness
        self.dropped = 0

    def __call__(self, args: Any, rollout_id: int | None, buffer: list[list[Any]], num_samples: int) -> list[list[Any]]:
        """Drop stale groups from `buffer`, then pop the `num_samples` oldest."""
        starts = [_start_rollout_id(g) for g in buffer]
        current = serving_version()
        if self.max_staleness is not None and current is not None:
            stale = {i for i, g in enumerate(buffer) if group_staleness(g, current) > self.max_staleness}
            if stale:
                self.dropped += len(stale)
                logger.info("oldest_first: dropped %d groups staler than %d weight versions at version %d "
                            "(rollout %s)", len(stale), self.max_staleness, current, rollout_id)
                buffer[:] = [g for i, g in enumerate(buffer) if i not in stale]
                starts = [s for i, s in enumerate(starts) if i not in stale]
        ranked = sorted(range(len(buffer)), key=lambda i: (starts[i] is None, starts[i] or 0, i))
        chosen = ranked[:num_samples]
        out = [buffer[i] for i in chosen]
        taken = set(chosen)
        buffer[:] = [g for i, g in enumerate(buffer) if i not in taken]
        return out

    def state_dict(self) -> dict[str, Any]:
        """The drop counter."""
        return {"dropped": self.dropped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the drop counter."""
        self.dropped = int(state["dropped"])

    def metrics(self) -> dict[str, float]:
        """`buffer/stale_dropped`: groups dropped so far."""
        return {"buffer/stale_dropped": float(self.dropped)}


# YAML: `_target_: pipeline.data.buffer_filters.oldest_first` with `max_staleness: N`
reward_topk.plugin_requires = NEEDS_BUFFER  # type: ignore[attr-defined]
oldest_first = OldestFirst
