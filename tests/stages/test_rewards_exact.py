"""Advantages: exact zeros for all-equal groups, and one rule for groups of one sample (n = 1)."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from pipeline.samples.sample import Sample
from pipeline.stages.rewards import MEAN_SUBTRACTING, post_process_rewards


def _args(**over):
    base = dict(advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                n_samples_per_prompt=2, rollout_batch_size=2, group_mode="slime", reward_key=None)
    base.update(over)
    return SimpleNamespace(**base)


def _samples(rewards, n):
    return [Sample(group_index=i // n, index=i, reward=r) for i, r in enumerate(rewards)]


def test_slime_numerics_are_off_for_an_all_equal_group():
    """The defect this guards against: float32 mean one ulp off, then divided by 0 + 1e-6."""
    t = torch.tensor([3.1, 3.1, 3.1])
    naive = (t - t.mean()) / ((t - t.mean()).std() + 1e-6)
    assert naive.abs().max() > 0.1
    _, out = post_process_rewards(_args(n_samples_per_prompt=3, rollout_batch_size=1), _samples([3.1] * 3, 3))
    assert out == [0.0, 0.0, 0.0]


VALUES = [0.1, 0.7, 3.1, 1 / 3, -2.9, 1e-8, 123456.789, 3.4e38, -1e30, 1e6 + 0.1, 0.30000000000000004]


@pytest.mark.parametrize("estimator", sorted(MEAN_SUBTRACTING))
@pytest.mark.parametrize("n", [2, 3, 7, 16, 64])
@pytest.mark.parametrize("group_mode", ["slime", "group_index"])
def test_all_equal_groups_give_exact_zeros(estimator, n, group_mode):
    rng = random.Random(n)
    groups = 3
    # every group all-equal, each with its own awkward value; plus one mixed group last
    rewards = [v for g in range(groups) for v in [VALUES[rng.randrange(len(VALUES))]] * n]
    mixed = [rng.choice([0.0, 1.0, 0.5]) for _ in range(n - 1)] + [2.0]
    args = _args(advantage_estimator=estimator, n_samples_per_prompt=n, rollout_batch_size=groups + 1,
                 group_mode=group_mode)
    _, out = post_process_rewards(args, _samples(rewards + mixed, n))
    assert all(x == 0.0 and not math.copysign(1.0, x) < 0 for x in out[: groups * n]), out[: groups * n]
    assert all(math.isfinite(x) for x in out) and any(x != 0.0 for x in out[groups * n:])


def test_mixed_groups_keep_slime_float32_values():
    raw = [0.3, 0.1, 0.7, 3.1, 3.1, 3.1]
    _, out = post_process_rewards(_args(n_samples_per_prompt=3), _samples(raw, 3))
    t = torch.tensor(raw[:3], dtype=torch.float)
    t = (t - t.mean()) / ((t - t.mean()).std() + 1e-6)
    assert out[:3] == t.tolist() and out[3:] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("estimator,std,expected", [
    ("grpo", True, [0.7071057558059692, -0.7071057558059692]),   # slime's value for this case
    ("grpo", False, [0.5, -0.5]),
    ("dr_grpo", True, [0.5, -0.5]),
])
def test_n1_rule_one_sample_groups_are_zero_uneven_fan_out_is_one_group(estimator, std, expected):
    """n_samples_per_prompt = 1: std normalisation applies to every group of 2+ samples; a group
    of one sample gets 0. Plain n=1 (one sample per group) and uneven fan-out (all samples one
    group) follow that same rule."""
    def advantages(samples, **over):
        args = _args(advantage_estimator=estimator, grpo_std_normalization=std, n_samples_per_prompt=1, **over)
        return post_process_rewards(args, samples)[1]

    assert advantages(_samples([1.0, 0.0], 1), rollout_batch_size=2) == [0.0, 0.0]   # a group per prompt
    fan_out = advantages(_samples([1.0, 0.0], 1), rollout_batch_size=3)                 # uneven: one group
    assert fan_out == pytest.approx(expected, abs=1e-7)
    by_index = advantages([Sample(group_index=0, index=0, reward=1.0), Sample(group_index=0, index=1, reward=0.0),
                           Sample(group_index=1, index=2, reward=5.0)], group_mode="group_index")
    assert by_index[:2] == pytest.approx(expected, abs=1e-7) and by_index[2] == 0.0


def test_single_sample_gives_zero_not_nan():
    _, out = post_process_rewards(_args(n_samples_per_prompt=1, rollout_batch_size=5), _samples([0.25], 1))
    assert out == [0.0]
