"""Rollout and eval metrics on skewed data, where mean, median, max and min all differ.

Symmetric test rewards (`[1, 1, 0, 1, 0, 0]`) cannot tell a mean from a median; these can.
"""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

from pipeline.samples.sample import Sample
from pipeline.stages import RolloutContext, StageParts
from pipeline.stages.log import eval_metrics, log_stage, pass_at_k, rollout_metrics

pytestmark = pytest.mark.timeout(30)

ARGS = SimpleNamespace(reward_key=None, n_samples_per_eval_prompt=1)


def samples(rewards: list[float], lengths: list[int], n: int) -> list[Sample]:
    return [Sample(group_index=i // n, index=i, reward=r, tokens=[7] * (3 + ln), response_length=ln)
            for i, (r, ln) in enumerate(zip(rewards, lengths))]


def test_raw_reward_is_the_mean_and_lengths_are_mean_median_max_min():
    rewards = [1.0, 0.0, 0.0, 0.0, 0.5, -1.0, 3.0, 3.0, 0.0]  # mean 0.7222, median 0.0
    lengths = [1, 2, 2, 2, 30, 4, 5, 6, 50]  # mean 11.33, median 4
    m = rollout_metrics(ARGS, samples(rewards, lengths, n=3), rollout_time=4.0)
    assert m["rollout/raw_reward"] == pytest.approx(6.5 / 9)
    assert statistics.median(rewards) != pytest.approx(6.5 / 9)
    assert m["rollout/response_len/mean"] == pytest.approx(102 / 9)
    assert m["rollout/response_len/median"] == 4.0
    assert m["rollout/response_len/max"] == 50.0
    assert m["rollout/response_len/min"] == 1.0
    assert m["rollout/num_samples"] == 9.0
    assert m["perf/rollout_time"] == 4.0
    assert m["perf/tokens_per_sec"] == pytest.approx(102 / 4.0)


def test_pass_rate_counts_strictly_positive_rewards():
    rewards = [1.0, 0.0, -1.0, 0.25, 0.0, 0.0, 0.0, 0.0]
    m = rollout_metrics(ARGS, samples(rewards, [1] * 8, n=2), rollout_time=1.0)
    assert m["rollout/pass_rate"] == pytest.approx(2 / 8)
    assert m["rollout/raw_reward"] == pytest.approx(0.25 / 8)


def test_truncated_ratio_counts_truncated_status_only():
    s = samples([0.0] * 5, [1] * 5, n=5)
    s[1].status = Sample.Status.TRUNCATED
    s[2].status = Sample.Status.ABORTED
    s[3].status = "truncated"  # a plugin may set the plain string
    m = rollout_metrics(ARGS, s, rollout_time=1.0)
    assert m["rollout/truncated_ratio"] == pytest.approx(2 / 5)


def test_zero_std_counts_each_constant_group_by_its_reward():
    # groups: [0.5,0.5] const, [0.5,0.5] const, [1,1,..] const, [0,1] varied, [0.3] singleton (not counted)
    s = [Sample(group_index=g, index=i, reward=r, response_length=1)
         for i, (g, r) in enumerate([(0, .5), (0, .5), (1, .5), (1, .5), (2, 1.0), (2, 1.0), (2, 1.0),
                                     (3, 0.0), (3, 1.0), (4, 0.3)])]
    m = rollout_metrics(ARGS, s, rollout_time=1.0)
    zero_std = {k: v for k, v in m.items() if k.startswith("rollout/zero_std/")}
    assert zero_std == {"rollout/zero_std/count_0.5": 2.0, "rollout/zero_std/count_1.0": 1.0}


def test_zero_std_samples_without_group_index_are_singletons():
    s = [Sample(group_index=None, index=i, reward=1.0, response_length=1) for i in range(3)]
    m = rollout_metrics(ARGS, s, rollout_time=1.0)
    assert not [k for k in m if k.startswith("rollout/zero_std/")]


def test_zero_std_key_rounds_the_reward_to_one_decimal():
    s = [Sample(group_index=0, index=i, reward=0.75, response_length=1) for i in range(2)]
    m = rollout_metrics(ARGS, s, rollout_time=1.0)
    assert [k for k in m if k.startswith("rollout/zero_std/")] == ["rollout/zero_std/count_0.8"]


def test_throughput_for_short_and_zero_rollout_times():
    assert rollout_metrics(ARGS, samples([1.0], [5], n=1), rollout_time=0.5)["perf/tokens_per_sec"] == 10.0
    assert rollout_metrics(ARGS, samples([1.0], [5], n=1), rollout_time=0.0)["perf/tokens_per_sec"] == 0.0


def test_raw_reward_uses_reward_key():
    s = [Sample(group_index=0, index=i, reward={"acc": a, "len": 100.0}, response_length=1)
         for i, a in enumerate([1.0, 0.0, 0.0])]
    m = rollout_metrics(SimpleNamespace(reward_key="acc"), s, rollout_time=1.0)
    assert m["rollout/raw_reward"] == pytest.approx(1 / 3)


def test_eval_metrics_on_skewed_rewards():
    data = {"empty": {"rewards": []},  # skipped, and the datasets after it still count
            "skew": {"rewards": [3.0, 0.0, 0.0, 0.0, 0.0, 0.0], "truncated": [1, 0, 0, 0, 0, 0]}}
    m = eval_metrics(SimpleNamespace(n_samples_per_eval_prompt=3), data)
    assert m["eval/skew"] == pytest.approx(0.5)
    assert m["eval/skew-truncated_ratio"] == pytest.approx(1 / 6)
    assert m["eval/skew-pass@3"] == pytest.approx(0.5)  # one of two prompts has a correct sample
    assert m["eval/skew-pass@1"] == pytest.approx(1 / 6)
    assert not [k for k in m if "empty" in k]
    one = eval_metrics(SimpleNamespace(n_samples_per_eval_prompt=1), {"d": {"rewards": [1, 0, -1]}})
    assert one == {"eval/d": 0.0, "eval/d-pass@1": pytest.approx(1 / 3)}
    uneven = eval_metrics(SimpleNamespace(n_samples_per_eval_prompt=2), {"d": {"rewards": [1, 0, 1]}})
    assert "eval/d-pass@2" not in uneven
    pairs = eval_metrics(SimpleNamespace(n_samples_per_eval_prompt=2), {"d": {"rewards": [1, 0, 0, 0]}})
    assert pairs["eval/d-pass@2"] == 0.5 and pairs["eval/d-pass@1"] == 0.25
    with pytest.raises(ValueError, match="rewards must be numbers"):
        eval_metrics(ARGS, {"d": {"rewards": [True]}})


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 1, 2, 1 - 6 / 10), (5, 2, 2, 1 - 3 / 10), (5, 3, 2, 1 - 1 / 10), (5, 4, 2, 1.0), (4, 0, 1, 0.0), (6, 1, 1, 1 / 6),
])
def test_pass_at_k_values(n: int, c: int, k: int, expected: float):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_log_stage_merges_extra_filter_and_buffer_metrics():
    source = SimpleNamespace(get_buffer_length=lambda: 4,
                             buffer_filter=SimpleNamespace(metrics=lambda: {"buffer/stale_dropped": 2.0}))
    ctx = RolloutContext(rollout_id=0, samples=samples([1.0, 0.0, 0.0], [1, 1, 1], n=3), rollout_time=1.0,
                         extra_metrics={"custom": 1.5, "rollout/raw_reward": 99.0, "x/y": 2})
    log_stage(ctx, StageParts(args=ARGS, data_source=source, rollout_fn=None))
    assert ctx.metrics["rollout/custom"] == 1.5 and ctx.metrics["x/y"] == 2
    assert ctx.metrics["rollout/raw_reward"] == pytest.approx(1 / 3)  # the default wins on a clash
    assert ctx.metrics["buffer/stale_dropped"] == 2.0
    assert ctx.metrics["rollout/buffer_size"] == 4.0


def test_log_stage_passes_args_to_the_hook_and_the_default_metrics():
    args = SimpleNamespace(reward_key="acc", n_samples_per_eval_prompt=1)
    seen = []
    ctx = RolloutContext(rollout_id=3, samples=[Sample(group_index=0, index=0, reward={"acc": 0.5}, response_length=1)],
                         rollout_time=1.0)
    hook = lambda rollout_id, a, *rest: seen.append(a) or False  # noqa: E731
    log_stage(ctx, StageParts(args=args, data_source=SimpleNamespace(), rollout_fn=None, plugins={"rollout_log": hook}))
    assert seen == [args]
    assert ctx.metrics["rollout/raw_reward"] == 0.5
    assert "rollout/buffer_size" not in ctx.metrics  # a data source without get_buffer_length


class PluginSample:
    """A plugin's own sample class: a plain string status (no enum, no coercion)."""

    def __init__(self, index: int, status: str) -> None:
        self.index, self.group_index, self.status, self.reward, self.response_length = index, None, status, 0.0, 1

    def get_reward_value(self, args):
        return self.reward


def test_truncated_ratio_reads_a_plugin_samples_plain_string_status():
    s = [PluginSample(0, "truncated"), PluginSample(1, "completed"), PluginSample(2, "truncated"),
         PluginSample(3, "aborted")]
    assert rollout_metrics(ARGS, s, rollout_time=1.0)["rollout/truncated_ratio"] == pytest.approx(2 / 4)
