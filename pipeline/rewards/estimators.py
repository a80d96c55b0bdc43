"""The advantage estimators and grouping modes by name (docs/contracts.md §7), without torch:
the pre-flight check (`pipeline.config.rules`) reads them before anything heavy is imported;
`pipeline.stages.rewards` computes with them."""

from __future__ import annotations

__all__ = ["ESTIMATORS", "GROUP_MODES", "LEAVE_ONE_OUT", "MEAN_ONLY", "MEAN_STD", "MEAN_SUBTRACTING", "PASS_THROUGH"]

# subtract the group mean; with grpo_std_normalization divide by (unbiased std + 1e-6)
MEAN_STD = frozenset({"grpo", "gspo", "cispo"})
# subtract the group mean only
MEAN_ONLY = frozenset({"reinforce_plus_plus_baseline", "dr_grpo"})
# leave-one-out baseline
LEAVE_ONE_OUT = frozenset({"rloo"})
# raw rewards pass through
PASS_THROUGH = frozenset({"reinforce_plus_plus", "none"})
ESTIMATORS = MEAN_STD | MEAN_ONLY | LEAVE_ONE_OUT | PASS_THROUGH
# estimators whose advantage subtracts a group mean (all zero for groups of one sample)
MEAN_SUBTRACTING = MEAN_STD | MEAN_ONLY | LEAVE_ONE_OUT
GROUP_MODES = frozenset({"slime", "group_index"})
