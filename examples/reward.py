"""Reward functions.

slime form:   reward=custom reward.custom_rm_path=examples.reward.brevity_math
              (`async fn(args, sample) -> float`; with reward.group_rm=true
              `async fn(args, samples) -> list[float]`)
native form:  reward=brevity   (examples/conf/reward/brevity.yaml): an object with
              `async score(args, samples) -> list[float]`, replacing the dispatcher
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["BrevityReward", "brevity_math", "final_answer"]

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def final_answer(response: str) -> str | None:
    """The last `\\boxed{...}` of a response, else its last number, else None."""
    boxed = _BOXED.findall(response)
    if boxed:
        return boxed[-1].strip()
    numbers = _NUMBER.findall(response)
    return numbers[-1] if numbers else None


def _score(sample: Any, penalty_per_token: float, free_tokens: int) -> float:
    right = final_answer(sample.response or "") == str(sample.label).strip()
    over = max(0, int(sample.response_length) - free_tokens)
    return (1.0 - penalty_per_token * over) if right else 0.0


async def brevity_math(args: Any, sample: Any) -> float:
    """1 for the right final answer minus 0.005 per response token beyond 16; 0 when wrong."""
    return _score(sample, penalty_per_token=0.005, free_tokens=16)


class BrevityReward:
    """The same reward as a native part: its constants come from YAML."""

    # score one sample per call as it finishes (True: the whole group once it is done)
    group_rm = False

    def __init__(self, penalty_per_token: float = 0.005, free_tokens: int = 16) -> None:
        self.penalty_per_token = penalty_per_token
        self.free_tokens = free_tokens

    async def score(self, args: Any, samples: list[Any]) -> list[float]:
        """One reward per sample."""
        return [_score(s, self.penalty_per_token, self.free_tokens) for s in samples]

    def close(self) -> None:
        """Nothing to release."""
