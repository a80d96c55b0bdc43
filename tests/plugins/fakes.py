"""Small fakes referenced by dotted path from composed configs in tests."""

from __future__ import annotations

from typing import Any

EVENTS: list[tuple[str, Any]] = []


class RecordingSink:
    """A logger sink that records start / log / finish into EVENTS."""

    def __init__(self) -> None:
        EVENTS.clear()

    def start(self, **kwargs: Any) -> None:
        EVENTS.append(("start", kwargs))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        EVENTS.append(("log", (step, dict(metrics))))

    def finish(self, exit_code: int = 0) -> None:
        EVENTS.append(("finish", exit_code))


def failing_rollout(args, rollout_id, data_source, evaluation=False):
    """A slime rollout function that fails at rollout 1."""
    if rollout_id == 1:
        raise RuntimeError("boom at rollout 1")
    from tests.plugins.slime_plugins import generate_rollout

    return generate_rollout(args, rollout_id, data_source, evaluation)
