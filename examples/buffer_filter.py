"""Buffer filters: `fn(args, rollout_id, buffer, num_samples) -> list of groups`, removing what
they return from `buffer` in place (used with `data_source=buffered`).

slime form:   filter.path=examples.buffer_filter.newest_first
native form:  filter=shortest_first   (examples/conf/filter/shortest_first.yaml)
"""

from __future__ import annotations

from typing import Any

__all__ = ["ShortestFirst", "newest_first"]


def newest_first(args: Any, rollout_id: int | None, buffer: list[list[Any]], num_samples: int) -> list[list[Any]]:
    """LIFO: the most recently buffered groups first; marks each served sample's metadata."""
    n = min(len(buffer), num_samples)
    out = buffer[len(buffer) - n:]
    del buffer[len(buffer) - n:]
    for group in out:
        for sample in group:
            sample.metadata["buffer_filter"] = "newest_first"
    return out


class ShortestFirst:
    """Groups with the shortest mean response first (ties: oldest first), at most
    `max_per_rollout` groups per call. Stateful: it counts what it served, and the data source
    checkpoints that count through `state_dict` / `load_state_dict` (so resume= keeps it)."""

    def __init__(self, max_per_rollout: int | None = None) -> None:
        self.max_per_rollout = max_per_rollout
        self.served = 0

    def __call__(self, args: Any, rollout_id: int | None, buffer: list[list[Any]],
                 num_samples: int) -> list[list[Any]]:
        """Take up to `num_samples` groups, shortest mean response_length first."""
        n = min(len(buffer), num_samples, self.max_per_rollout if self.max_per_rollout is not None else num_samples)
        order = sorted(range(len(buffer)), key=lambda i: (sum(s.response_length for s in buffer[i]) / len(buffer[i]), i))
        picked = sorted(order[:n])
        out = [buffer[i] for i in picked]
        for i in reversed(picked):
            del buffer[i]
        for group in out:
            for sample in group:
                sample.metadata["buffer_filter"] = "shortest_first"
        self.served += len(out)
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state, saved with the data-source checkpoint."""
        return {"served": self.served}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self.served = int(state["served"])
