"""Stage: post-process rewards into training rewards (docs/contracts.md §7), with slime's float32 numerics.

Estimators and what they do (when `rewards_normalization` is on):
- grpo, gspo, cispo: subtract the group mean; with `grpo_std_normalization` divide by
  (unbiased std + 1e-6).
- reinforce_plus_plus_baseline, dr_grpo: subtract the group mean only.
- rloo: leave-one-out baseline, r_i - mean(r_j, j != i) = n / (n - 1) * (r_i - mean).
- reinforce_plus_plus, none (and anything with normalisation off): raw rewards pass through.

Exactness: a group whose (float32) rewards are all equal gets exactly 0.0 for every estimator
that subtracts a mean, whatever the values (slime's float32 mean of [3.1, 3.1, 3.1] is one ulp
off, which std normalisation would blow up to 0.2384). One rule for small groups: std
normalisation applies to every group of two or more samples, and a group of one sample gets 0
(its own mean). So n_samples_per_prompt = 1 gives all-zero advantages when each prompt is a
group, and slime's values when uneven fan-out makes all samples one group
([[1.0], [0.0]] -> [0.7071, -0.7071]).

Grouping (`group_mode`): "slime" views the rewards as consecutive groups of n when there are
exactly n x rollout_batch_size of them, else as one group; "group_index" groups samples by
their `group_index` (any order, any group sizes).
A custom hook `fn(args, samples) -> (raw_rewards, rewards)` replaces this stage.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from pipeline.rewards.estimators import ESTIMATORS, GROUP_MODES, LEAVE_ONE_OUT, MEAN_STD, MEAN_SUBTRACTING, PASS_THROUGH
from pipeline.stages.context import RolloutContext, StageParts

__all__ = ["ESTIMATORS", "GROUP_MODES", "MEAN_SUBTRACTING", "post_process_rewards", "raw_reward_values",
           "rewards_stage"]


def raw_reward_values(args: Any, samples: list[Any]) -> list[float]:
    """`get_reward_value(args)` of every sample, checked to be numbers."""
    raw = []
    for s in samples:
        value = s.get_reward_value(args)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(
                f"sample {s.index}: reward {value!r} is not a number; set reward_key=<name> for "
                f"dict rewards, and make sure every sample was scored"
            )
        if not math.isfinite(value):
            raise ValueError(
                f"sample {s.index}: reward {value!r} is not a finite number; the reward function "
                f"(or reward_key entry) must return a real number"
            )
        raw.append(value)
    return raw


def _normalise(block: torch.Tensor, estimator: str, use_std: bool) -> torch.Tensor:
    """Normalise each row of `block` (shape [groups, group size]); all-equal rows give exactly 0."""
    size = block.shape[-1]
    out = block - block.mean(dim=-1, keepdim=True)
    if estimator in LEAVE_ONE_OUT and size > 1:
        out = out * (size / (size - 1))
    elif estimator in MEAN_STD and use_std and size > 1:
        out = out / (out.std(dim=-1, keepdim=True) + 1e-6)
    all_equal = (block == block[..., :1]).all(dim=-1, keepdim=True)
    return out.masked_fill(all_equal, 0.0)


def post_process_rewards(args: Any, samples: list[Any]) -> tuple[list[Any], list[Any]]:
    """slime's `_post_process_rewards` (plus rloo, dr_grpo and group_index grouping)."""
    estimator = args.advantage_estimator
    if estimator not in ESTIMATORS:
        raise ValueError(f"advantage.estimator: unknown {estimator!r}; expected one of {sorted(ESTIMATORS)}")
    raw = raw_reward_values(args, samples)
    if estimator in PASS_THROUGH or not args.rewards_normalization:
        return raw, raw
    n = int(args.n_samples_per_prompt)
    use_std = bool(args.grpo_std_normalization)
    rewards = torch.tensor(raw, dtype=torch.float)
    mode = args.group_mode
    if mode == "slime":
        if rewards.shape[-1] == n * int(args.rollout_batch_size):
            block = rewards.reshape(-1, n)
        else:
            block = rewards.view(-1, rewards.shape[-1])
        return raw, _normalise(block, estimator, use_std).flatten().tolist()
    if mode == "group_index":
        out = torch.empty_like(rewards)
        positions: dict[Any, list[int]] = {}
        for i, s in enumerate(samples):
            if s.group_index is None:
                raise ValueError(f"advantage.group_mode=group_index: sample {s.index} has group_index None")
            positions.setdefault(s.group_index, []).append(i)
        for idx in positions.values():
            sel = torch.tensor(idx, dtype=torch.long)
            out[sel] = _normalise(rewards[sel].view(1, -1), estimator, use_std).flatten()
        return raw, out.tolist()
    raise ValueError(f"advantage.group_mode: unknown {mode!r}; expected one of {sorted(GROUP_MODES)}")


def rewards_stage(ctx: RolloutContext, parts: StageParts) -> None:
    """Run the custom hook when configured, else `post_process_rewards`."""
    if parts.plugin("reward_post_process") is not None:
        raw, rewards = parts.plugin("reward_post_process")(parts.args, ctx.samples)
    elif parts.plugin("convert_to_train_data") is not None:
        return  # slime: a custom convert hook replaces reward post-processing too
    else:
        raw, rewards = post_process_rewards(parts.args, ctx.samples)
    if len(raw) != len(ctx.samples) or len(rewards) != len(ctx.samples):
        raise ValueError(
            f"reward post-process returned {len(raw)} raw rewards and {len(rewards)} rewards for "
            f"{len(ctx.samples)} samples; expected one of each per sample"
        )
    ctx.raw_rewards, ctx.rewards = list(raw), list(rewards)
