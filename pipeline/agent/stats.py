"""The agent loop's counters for one rollout (or eval) call, and their `agent/*` metrics."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["AgentStats", "METRIC_KEYS"]

# every key `AgentStats.metrics` returns (the console and report read some of them)
METRIC_KEYS = ("agent/samples", "agent/turns_mean", "agent/tool_calls", "agent/malformed_calls", "agent/tool_errors",
               "agent/tool_timeouts", "agent/tool_latency_mean_s", "agent/tool_latency_p95_s",
               "agent/tool_token_share", "agent/max_turns_reached", "agent/budget_truncated", "agent/failed")


def _p95(values: list[float]) -> float:
    """Nearest-rank 95th percentile (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass
class AgentStats:
    """Counts over every sample the loop worked on in one call (kept or not by the batch)."""

    samples: int = 0
    turns: int = 0
    tool_calls: int = 0
    malformed_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    model_tokens: int = 0
    tool_tokens: int = 0
    latencies: list[float] = field(default_factory=list)
    stops: Counter[str] = field(default_factory=Counter)

    def metrics(self) -> dict[str, float]:
        """`agent/*`: turns per sample, calls run, malformed calls, tool errors (timeouts among them),
        tool latency (mean / p95, seconds per call including retries and the wait for a slot), the
        share of response tokens that are tool output, and how many samples stopped at max_turns /
        the token budget / a failed tool."""
        appended = self.model_tokens + self.tool_tokens
        return {
            "agent/samples": self.samples,
            "agent/turns_mean": self.turns / self.samples if self.samples else 0.0,
            "agent/tool_calls": self.tool_calls,
            "agent/malformed_calls": self.malformed_calls,
            "agent/tool_errors": self.tool_errors,
            "agent/tool_timeouts": self.tool_timeouts,
            "agent/tool_latency_mean_s": sum(self.latencies) / len(self.latencies) if self.latencies else 0.0,
            "agent/tool_latency_p95_s": _p95(self.latencies),
            "agent/tool_token_share": self.tool_tokens / appended if appended else 0.0,
            "agent/max_turns_reached": self.stops["max_turns"],
            "agent/budget_truncated": self.stops["budget"] + self.stops["turn_cap"],
            "agent/failed": self.stops["tool_error"],
        }
