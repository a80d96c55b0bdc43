"""Reward post-processing corners the docs/contracts.md §7 vectors do not reach: one sample per prompt, singleton
groups in group_index mode, the error messages, and the stage around the estimator."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from pipeline.samples.sample import Sample
from pipeline.stages import RolloutContext, StageParts
from pipeline.stages.rewards import post_process_rewards, raw_reward_values, rewards_stage

pytestmark = pytest.mark.timeout(30)


def args(**over):
    base = dict(advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                n_samples_per_prompt=2, rollout_batch_size=2, group_mode="slime", reward_key=None)
    base.update(over)
    return SimpleNamespace(**base)


def samples(rewards, groups=None):
    groups = groups if groups is not None else [i // 2 for i in range(len(rewards))]
    return [Sample(group_index=g, index=i, reward=r) for i, (r, g) in enumerate(zip(rewards, groups))]


def test_rloo_with_one_sample_per_prompt_gives_zero():
    a = args(advantage_estimator="rloo", n_samples_per_prompt=1, rollout_batch_size=3)
    assert post_process_rewards(a, samples([1.0, 0.0, 3.0], [0, 1, 2]))[1] == [0.0, 0.0, 0.0]


def test_group_index_singleton_group_is_zero_not_nan():
    a = args(group_mode="group_index")
    _, out = post_process_rewards(a, samples([1.0, 0.0, 5.0], [0, 0, 1]))
    assert not any(math.isnan(x) for x in out)
    assert out[2] == 0.0 and out[0] == pytest.approx(-out[1]) and out[0] > 0


@pytest.mark.parametrize("mode", ["slime", "group_index"])
def test_an_all_equal_group_is_exactly_zero_next_to_a_varied_one(mode):
    # float32 mean of [3.1, 3.1, 3.1] is one ulp off; std normalisation would blow that up to ~0.24.
    # Each row is judged on its own: the varied group next to it still gets its normalised values.
    a = args(n_samples_per_prompt=3, rollout_batch_size=2, group_mode=mode)
    _, out = post_process_rewards(a, samples([3.1, 3.1, 3.1, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1]))
    assert out[:3] == [0.0, 0.0, 0.0]
    # [1, 0, 0]: mean 1/3, unbiased std sqrt(1/3)
    std = math.sqrt(1.0 / 3.0)
    assert out[3:] == pytest.approx([(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std], rel=1e-5)


def test_error_messages():
    with pytest.raises(ValueError, match="group_mode=group_index: sample 1 has group_index None"):
        post_process_rewards(args(group_mode="group_index"), samples([1.0, 0.0], [0, None]))
    with pytest.raises(ValueError, match=r"group_mode: unknown 'other'; expected one of \['group_index', 'slime'\]"):
        post_process_rewards(args(group_mode="other"), samples([1.0, 0.0]))
    with pytest.raises(ValueError, match="sample 0: reward inf is not a finite number"):
        raw_reward_values(args(), samples([float("inf")]))


def test_stage_runs_the_estimator_with_the_run_args():
    ctx = RolloutContext(rollout_id=0, samples=samples([1.0, 0.0, 1.0, 1.0]))
    rewards_stage(ctx, StageParts(args=args(grpo_std_normalization=False), data_source=None, rollout_fn=None))
    assert ctx.raw_rewards == [1.0, 0.0, 1.0, 1.0] and ctx.rewards == [0.5, -0.5, 0.0, 0.0]


def test_stage_passes_args_to_the_hook_and_checks_both_lengths():
    a = args()
    seen = []

    def hook(hook_args, hook_samples):
        seen.append(hook_args)
        return [s.reward for s in hook_samples], [0.0] * (len(hook_samples) - 1)

    ctx = RolloutContext(rollout_id=0, samples=samples([1.0, 0.0]))
    with pytest.raises(ValueError, match="returned 2 raw rewards and 1 rewards for 2 samples"):
        rewards_stage(ctx, StageParts(args=a, data_source=None, rollout_fn=None, plugins={"reward_post_process": hook}))
    assert seen == [a]
