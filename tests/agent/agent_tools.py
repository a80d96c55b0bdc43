"""Tools for the agent-loop tests, loaded by dotted path (tests.agent.agent_tools.<name>)."""

from __future__ import annotations

import asyncio
import time

from pipeline.agent.calculator import calculator
from pipeline.agent.tools import ToolError

# how many calls each tool got, and the most `slow` calls running at once
CALLS: dict[str, int] = {}
RUNNING = {"now": 0, "max": 0}


def reset() -> None:
    """Forget the counters."""
    CALLS.clear()
    RUNNING.update(now=0, max=0)


async def slow(expression: str) -> str:
    """Wait a little, then answer like the calculator (counts how many run at once).

    Args:
        expression: the expression.
    """
    CALLS["slow"] = CALLS.get("slow", 0) + 1
    RUNNING["now"] += 1
    RUNNING["max"] = max(RUNNING["max"], RUNNING["now"])
    try:
        await asyncio.sleep(0.05)
    finally:
        RUNNING["now"] -= 1
    return calculator(expression)


async def sleepy(expression: str) -> str:
    """Sleep 0.5 s, then answer like the calculator.

    Args:
        expression: the expression.
    """
    await asyncio.sleep(0.5)
    return calculator(expression)


async def hangs(expression: str) -> str:
    """Never answers (the registry's timeout ends it).

    Args:
        expression: ignored.
    """
    await asyncio.sleep(3600)
    return ""


def broken(expression: str) -> str:
    """Always fails.

    Args:
        expression: ignored.
    """
    raise ToolError("the backend is down")


def flaky(expression: str) -> str:
    """Fails with ConnectionError on its first two calls, then answers.

    Args:
        expression: the expression.
    """
    CALLS["flaky"] = CALLS.get("flaky", 0) + 1
    if CALLS["flaky"] <= 2:
        raise ConnectionError("connection reset")
    time.sleep(0.001)
    return calculator(expression)


def typed(count: int, label: str = "x", scale: float = 1.0, flags: list[str] | None = None) -> dict:
    """A tool with typed parameters.

    Args:
        count: how many.
        label: a name
            on two lines.
        scale: a factor.
    """
    return {"count": count, "label": label, "scale": scale}
