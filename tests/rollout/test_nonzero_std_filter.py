"""The bundled dynamic filters (nonzero_std): which groups they keep, the drop reason, the fallback."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.rollout.dynamic_filters import check_reward_nonzero_std, check_reward_nonzero_std_with_fallback
from pipeline.samples.sample import Sample

pytestmark = pytest.mark.timeout(20)

ARGS = SimpleNamespace(reward_key=None)


def group(*rewards):
    return [Sample(group_index=0, index=i, reward=r) for i, r in enumerate(rewards)]


@pytest.mark.parametrize(("rewards", "keep", "reason"), [
    ((1.0, 0.0), True, None),
    ((0.0, 0.0, 1e-3), True, None),
    ((1.0, 1.0, 1.0), False, "zero_std_1.0"),
    ((0.0, 0.0), False, "zero_std_0.0"),
    ((0.75, 0.75), False, "zero_std_0.8"),  # the reward rounded to one place
    ((-2.0, -2.0), False, "zero_std_-2.0"),
    ((1.0,), True, None),  # one sample: std undefined, kept
    # equal in float32 (dropped), but the reason names the first reward as slime does: 0.0, not 0.1
    ((0.04999999999, 0.05), False, "zero_std_0.0"),
])
def test_nonzero_std_keeps_groups_whose_rewards_differ(rewards, keep, reason):
    out = check_reward_nonzero_std(ARGS, group(*rewards))
    assert (out.keep, out.reason, out.keep_when_insufficient) == (keep, reason, False)


def test_nonzero_std_reads_the_reward_key():
    args = SimpleNamespace(reward_key="acc")
    same = [Sample(index=i, reward={"acc": 1.0, "len": float(i)}) for i in range(2)]
    assert check_reward_nonzero_std(args, same).keep is False
    assert check_reward_nonzero_std_with_fallback(args, same).keep is False


def test_integer_rewards_are_compared_as_floats():
    assert check_reward_nonzero_std(ARGS, group(1, 0)).keep is True
    assert check_reward_nonzero_std(ARGS, group(1, 1)).reason == "zero_std_1.0"


def test_fallback_marks_every_verdict_keep_when_insufficient():
    drop = check_reward_nonzero_std_with_fallback(ARGS, group(1.0, 1.0))
    assert (drop.keep, drop.reason, drop.keep_when_insufficient) == (False, "zero_std_1.0", True)
    keep = check_reward_nonzero_std_with_fallback(ARGS, group(1.0, 0.0))
    assert (keep.keep, keep.reason, keep.keep_when_insufficient) == (True, None, True)
