"""Dynamic filters shipped with the pipeline: `fn(args, samples, **kwargs) -> DynamicFilterOutput`.

`check_reward_nonzero_std` is slime's filter (drop groups whose rewards all agree, reason
`zero_std_<reward rounded to 1 place>`), with the FIX that a one-sample group is kept (its std
is undefined; slime's NaN comparison drops every group forever when n_samples_per_prompt=1).
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.rollout.contracts import DynamicFilterOutput
from pipeline.stages.rewards import raw_reward_values

__all__ = ["check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"]


def check_reward_nonzero_std(args: Any, samples: list[Any], **kwargs: Any) -> DynamicFilterOutput:
    """Keep a group iff the float32 std of its rewards is > 0 (always keep one-sample groups)."""
    # numbers checked first: a dict reward without reward_key gets the message the advantage
    # stage gives ("... is not a number; set reward_key=<name> for dict rewards")
    rewards = raw_reward_values(args, samples)
    if len(rewards) < 2:
        return DynamicFilterOutput(keep=True)
    keep = bool(torch.tensor(rewards, dtype=torch.float).std() > 0.0)
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(float(rewards[0]), 1)}")


def check_reward_nonzero_std_with_fallback(args: Any, samples: list[Any], **kwargs: Any) -> DynamicFilterOutput:
    """As `check_reward_nonzero_std`, but a dropped group is kept when the batch could not be
    filled otherwise (`keep_when_insufficient=True`)."""
    out = check_reward_nonzero_std(args, samples, **kwargs)
    return DynamicFilterOutput(keep=out.keep, reason=out.reason, keep_when_insufficient=True)
