"""Small helpers on rollout groups (lists of Samples, fan-out items being lists themselves)."""

from __future__ import annotations

from typing import Any

__all__ = ["flatten_group", "first_index", "group_key", "buffer_size", "response_tokens"]


def flatten_group(group: list[Any]) -> list[Any]:
    """Samples of a group, fan-out lists expanded."""
    out: list[Any] = []
    for item in group:
        out.extend(item if isinstance(item, list) else [item])
    return out


def response_tokens(group: list[Any]) -> int:
    """Response tokens the group's samples hold (fan-outs expanded)."""
    return sum(int(s.response_length) for s in flatten_group(group))


def first_index(group: list[Any]) -> int:
    """Index of the group's first sample (the output sort key)."""
    first = flatten_group(group)[0]
    return first.index if first.index is not None else -1


def group_key(group: list[Any]) -> tuple[int, int]:
    """(group_index, first sample index) of a group; missing values sort first."""
    first = flatten_group(group)[0]
    gi, idx = getattr(first, "group_index", None), getattr(first, "index", None)
    return (-1 if gi is None else int(gi), -1 if idx is None else int(idx))


def buffer_size(data_source: Any) -> int:
    """Groups in the data source's buffer (0 for a plain source)."""
    if hasattr(data_source, "get_buffer_length"):
        return int(data_source.get_buffer_length())
    return len(getattr(data_source, "buffer", None) or [])
