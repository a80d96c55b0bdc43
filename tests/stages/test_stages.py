"""Per-rollout stages: validate rollout_id, flatten, rewards (docs/contracts.md §7 vectors), train data, log."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from pipeline.rollout.contracts import PluginOutputError
from pipeline.samples.sample import Sample
from pipeline.stages import RolloutContext, StageParts
from pipeline.stages.rewards import post_process_rewards, rewards_stage
from pipeline.stages.flatten import flatten_samples
from pipeline.stages.generate import generate_stage, sample_filter_stage
from pipeline.stages.log import eval_metrics, log_stage, pass_at_k, rollout_metrics
from pipeline.sinks.files import to_tensors
from pipeline.stages.train_data import convert_to_train_data, fill_rollout_ids, train_data_stage
from pipeline.stages.validate import RolloutIdError, check_rollout_ids


def _args(**over):
    base = dict(advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                n_samples_per_prompt=2, rollout_batch_size=2, group_mode="slime", reward_key=None,
                n_samples_per_eval_prompt=1)
    base.update(over)
    return SimpleNamespace(**base)


def _samples(rewards, n=2):
    return [Sample(group_index=i // n, index=i, reward=r, tokens=[1, 2, 3], response_length=2)
            for i, r in enumerate(rewards)]


# ------------------------------------------------------------------ validate / flatten
def test_fanout_siblings_must_share_rollout_id():
    a, b = Sample(index=0, rollout_id=5), Sample(index=1, rollout_id=5)
    check_rollout_ids([[[a, b]]])                      # fan-out, equal ids
    check_rollout_ids([[Sample(index=2), Sample(index=3, rollout_id=9)]])  # depth-1 group: free
    check_rollout_ids([[[Sample(index=4)]]])           # single-element fan-out: free
    with pytest.raises(RolloutIdError, match=r"rollout_id unset at samples\[1\]\[0\]\[1\]"):
        check_rollout_ids([[a], [[a, Sample(index=6)]]])
    with pytest.raises(RolloutIdError, match=r"rollout_ids differ.*samples\[1\]\[0\]\[0\]=1"):
        check_rollout_ids([[a], [[Sample(index=7, rollout_id=1), Sample(index=8, rollout_id=2)]]])


def test_flatten_repeatedly_and_rejects_empty_or_junk():
    s = [Sample(index=i) for i in range(5)]
    assert flatten_samples([[s[0], s[1]], [[s[2], [s[3]]], s[4]]]) == s
    with pytest.raises(PluginOutputError, match="no samples"):
        flatten_samples([[], []])
    with pytest.raises(PluginOutputError, match=r"samples\[0\]\[1\] is int"):
        flatten_samples([[s[0], 3]])


# ------------------------------------------------------------------ rewards
def test_spec_vectors_grpo():
    raw, out = post_process_rewards(_args(), _samples([1, 0, 1, 1]))
    assert raw == [1, 0, 1, 1]
    assert out == pytest.approx([0.70710576, -0.70710576, 0.0, 0.0], abs=1e-7)
    _, out = post_process_rewards(_args(grpo_std_normalization=False), _samples([1, 0, 1, 1]))
    assert out == [0.5, -0.5, 0.0, 0.0]
    _, out = post_process_rewards(_args(), _samples([1, 0, 0], n=3))  # uneven count: one group
    assert out == pytest.approx([1.1547, -0.57735, -0.57735], abs=1e-4)


def test_float32_numerics_match_torch_exactly():
    raw = [0.3, 0.1, 0.7, 0.2, 0.9, 0.9]
    _, out = post_process_rewards(_args(n_samples_per_prompt=3), _samples(raw, n=3))
    t = torch.tensor(raw, dtype=torch.float).reshape(-1, 3)
    t = t - t.mean(-1, keepdim=True)
    t = t / (t.std(-1, keepdim=True) + 1e-6)
    assert out == t.flatten().tolist()


@pytest.mark.parametrize("estimator,expected", [
    ("gspo", [0.70710576, -0.70710576, 0.0, 0.0]),
    ("cispo", [0.70710576, -0.70710576, 0.0, 0.0]),
    ("reinforce_plus_plus_baseline", [0.5, -0.5, 0.0, 0.0]),
    ("dr_grpo", [0.5, -0.5, 0.0, 0.0]),
    ("rloo", [1.0, -1.0, 0.0, 0.0]),
    ("reinforce_plus_plus", [1, 0, 1, 1]),
    ("none", [1, 0, 1, 1]),
])
def test_estimators(estimator, expected):
    _, out = post_process_rewards(_args(advantage_estimator=estimator), _samples([1, 0, 1, 1]))
    assert out == pytest.approx(expected, abs=1e-7)


def test_rloo_is_leave_one_out():
    raw = [1.0, 0.0, 0.5]
    _, out = post_process_rewards(_args(advantage_estimator="rloo", n_samples_per_prompt=3, rollout_batch_size=1),
                                  _samples(raw, n=3))
    expected = [r - (sum(raw) - r) / 2 for r in raw]
    assert out == pytest.approx(expected, abs=1e-6)


def test_n1_groups_of_one_are_zero_and_normalisation_off_passes_raw():
    _, out = post_process_rewards(_args(n_samples_per_prompt=1, rollout_batch_size=4), _samples([1, 0, 1, 1], n=1))
    assert out == [0.0, 0.0, 0.0, 0.0] and not any(math.isnan(x) for x in out)
    _, out = post_process_rewards(_args(rewards_normalization=False), _samples([1, 0, 1, 1]))
    assert out == [1, 0, 1, 1]


def test_group_index_mode_groups_by_group_index_in_any_order():
    s = _samples([1, 0, 1, 1])
    shuffled = [s[2], s[0], s[3], s[1]]  # groups 1,0,1,0
    _, out = post_process_rewards(_args(group_mode="group_index"), shuffled)
    assert out == pytest.approx([0.0, 0.70710576, 0.0, -0.70710576], abs=1e-7)
    uneven = _samples([1, 0, 0, 1, 1], n=3)  # groups of 3 and 2
    _, out = post_process_rewards(_args(group_mode="group_index", grpo_std_normalization=False), uneven)
    assert out == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0], abs=1e-6)


def test_reward_key_and_bad_rewards():
    s = [Sample(index=i, group_index=i // 2, reward={"acc": r, "fmt": 1}) for i, r in enumerate([1, 0, 1, 1])]
    raw, _ = post_process_rewards(_args(reward_key="acc"), s)
    assert raw == [1, 0, 1, 1]
    with pytest.raises(ValueError, match="sample 0: reward .* is not a number"):
        post_process_rewards(_args(), s)
    with pytest.raises(ValueError, match="unknown 'ppo'"):
        post_process_rewards(_args(advantage_estimator="ppo"), s)


def test_custom_post_process_hook_replaces_stage():
    seen = []

    def hook(args, samples):
        seen.append(len(samples))
        return [9] * len(samples), [0.25] * len(samples)

    ctx = RolloutContext(rollout_id=0, samples=_samples([1, 0]))
    rewards_stage(ctx, StageParts(args=_args(), data_source=None, rollout_fn=None, plugins={"reward_post_process": hook}))
    assert (ctx.raw_rewards, ctx.rewards, seen) == ([9, 9], [0.25, 0.25], [2])
    bad = StageParts(args=_args(), data_source=None, rollout_fn=None, plugins={"reward_post_process": lambda a, s: ([1], [1])})
    with pytest.raises(ValueError, match="1 raw rewards and 1 rewards for 2 samples"):
        rewards_stage(ctx, bad)


# ------------------------------------------------------------------ train data
def test_fill_rollout_ids_skips_ids_in_use():
    assert fill_rollout_ids([None, 0, None, 2, None, 5]) == [1, 0, 3, 2, 4, 5]


def test_convert_to_train_data_slime_keys():
    s = [
        Sample(index=0, tokens=[1, 2, 3, 4], response_length=2, status=Sample.Status.TRUNCATED, rollout_id=3),
        Sample(index=1, tokens=[1, 2, 5], response_length=1, loss_mask=[1], rollout_id=3),
        Sample(index=2, tokens=[1, 6, 7, 8], response_length=3, loss_mask=[1, 0, 1], remove_sample=True),
        Sample(index=3, tokens=[1, 9, 9], response_length=2, loss_mask=[0, 1]),
    ]
    td = convert_to_train_data(_args(), s, [1, 0, 1, 1], [0.5, -0.5, 0.0, 0.0])
    assert td["tokens"] == [[1, 2, 3, 4], [1, 2, 5], [1, 6, 7, 8], [1, 9, 9]]
    assert td["response_lengths"] == [2, 1, 3, 2]
    assert td["truncated"] == [1, 0, 0, 0]
    assert td["sample_indices"] == [0, 1, 2, 3]
    assert td["rollout_ids"] == [3, 3, 0, 1]
    assert td["loss_masks"] == [[1, 1], [1], [0, 0, 0], [0, 1]]
    assert td["rollout_mask_sums"] == [3, 3, 0, 1]
    assert td["rewards"] == [0.5, -0.5, 0.0, 0.0] and td["raw_reward"] == [1, 0, 1, 1]
    assert "rollout_log_probs" not in td
    with pytest.raises(ValueError, match="sample 7: loss_mask has 1 entries but response_length is 2"):
        convert_to_train_data(_args(), [Sample(index=7, response_length=2, loss_mask=[1])], [0], [0])


def test_log_probs_carried_and_tensors_padded(caplog):
    s = [Sample(index=0, tokens=[5, 6, 7], response_length=2, rollout_log_probs=[-0.5, -1.0]),
         Sample(index=1, tokens=[5, 8], response_length=1, rollout_log_probs=[-2.0])]
    td = convert_to_train_data(_args(), s, [1, 0], [0.7, -0.7])
    assert td["rollout_log_probs"] == [[-0.5, -1.0], [-2.0]]
    t = to_tensors(td, pad_token_id=99)
    assert t["tokens"].tolist() == [[5, 6, 7], [5, 8, 99]]
    assert t["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert t["loss_masks"].tolist() == [[1, 1], [1, 0]]
    assert t["rollout_log_probs"].tolist() == [[-0.5, -1.0], [-2.0, 0.0]]
    assert t["rewards"].dtype == torch.float32 and t["sample_indices"].tolist() == [0, 1]
    # only some samples with log-probs: left out whatever the order (slime looks at the first only)
    bare = Sample(index=1, tokens=[1], response_length=1)
    for mixed in ([s[0], bare], [bare, s[0]]):
        td = convert_to_train_data(_args(), mixed, [0, 0], [0, 0])
        assert "rollout_log_probs" not in td and "rollout_log_probs" not in to_tensors(td)
    assert "rollout_log_probs present on 1 of 2 samples (missing on samples [1])" in caplog.text


def test_custom_convert_hook_replaces_conversion_and_post_process():
    args, calls = _args(), []
    parts = StageParts(args=args, data_source=None, rollout_fn=None, plugins={
        "convert_to_train_data": lambda a, samples: calls.append((a, samples)) or {"n": len(samples)}})
    ctx = RolloutContext(rollout_id=0, samples=_samples([{"x": 1}, {"x": 0}]))
    rewards_stage(ctx, parts)  # skipped: dict rewards would fail the built-in one
    train_data_stage(ctx, parts)
    assert ctx.train_data == {"n": 2}
    assert calls == [(args, ctx.samples)] and calls[0][0] is args and calls[0][1] is ctx.samples
    bad = StageParts(args=args, data_source=None, rollout_fn=None,
                     plugins={"convert_to_train_data": lambda a, s: [1, 2]})
    with pytest.raises(TypeError, match=r"^convert hook returned list; expected a dict of lists$"):
        train_data_stage(ctx, bad)


def test_train_data_stage_converts_the_post_processed_rewards():
    ctx = RolloutContext(rollout_id=3, samples=_samples([1, 0]), raw_rewards=[1.0, 0.0], rewards=[0.5, -0.5])
    train_data_stage(ctx, StageParts(args=_args(), data_source=None, rollout_fn=None))
    assert ctx.train_data["raw_reward"] == [1.0, 0.0] and ctx.train_data["rewards"] == [0.5, -0.5]
    assert ctx.train_data["tokens"] == [[1, 2, 3], [1, 2, 3]] and ctx.train_data["sample_indices"] == [0, 1]


def test_rollout_data_postprocess_gets_slimes_two_call_forms():
    args, calls = _args(), []

    def new_form(a, rollout_id, data):
        data["seen"] = rollout_id  # edits the stage's train data in place
        calls.append(("new", a, rollout_id))

    def old_form(a):
        calls.append(("old", a))

    def var_form(*rest):  # any number of positional parameters: the full form
        calls.append(("var", len(rest)))

    for hook in (new_form, old_form, var_form):
        ctx = RolloutContext(rollout_id=7, samples=_samples([1, 0]), raw_rewards=[1, 0], rewards=[1, 0])
        train_data_stage(ctx, StageParts(args=args, data_source=None, rollout_fn=None,
                                         plugins={"rollout_data_postprocess": hook}))
        assert ctx.train_data.get("seen") == (7 if hook is new_form else None)
    assert calls == [("new", args, 7), ("old", args), ("var", 3)]


# ------------------------------------------------------------------ generate / sample filter
def test_generate_wraps_bare_list_and_keeps_metrics():
    s = _samples([1, 0])
    calls = []

    def rollout(args, rollout_id, data_source, evaluation=False):
        calls.append((rollout_id, evaluation))
        return [s]

    ctx = RolloutContext(rollout_id=4)
    generate_stage(ctx, StageParts(args=_args(), data_source="ds", rollout_fn=rollout))
    assert ctx.groups == [s] and calls == [(4, False)] and ctx.rollout_time >= 0


def test_sample_filter_hook_sets_remove_sample():
    s = _samples([1, 0])

    def drop_second(args, groups):
        groups[0][1].remove_sample = True

    ctx = RolloutContext(rollout_id=0, groups=[s], samples=s)
    sample_filter_stage(ctx, StageParts(args=_args(), data_source=None, rollout_fn=None,
                                        plugins={"rollout_sample_filter": drop_second}))
    td = convert_to_train_data(_args(), s, [1, 0], [1, 0])
    assert td["loss_masks"] == [[1, 1], [0, 0]]
    with pytest.raises(PluginOutputError, match="expected None"):
        sample_filter_stage(ctx, StageParts(args=_args(), data_source=None, rollout_fn=None,
                                            plugins={"rollout_sample_filter": lambda a, g: g}))


# ------------------------------------------------------------------ log
def test_rollout_metrics_names_and_values():
    s = _samples([1, 1, 0, 1, 0, 0], n=2)
    s[0].status = Sample.Status.TRUNCATED
    s[1].response_length = 6
    m = rollout_metrics(_args(), s, rollout_time=2.0)
    assert m["rollout/response_len/max"] == 6.0 and m["rollout/response_len/min"] == 2.0
    assert m["rollout/response_len/mean"] == pytest.approx(16 / 6)
    assert m["rollout/response_len/median"] == 2.0
    assert m["rollout/raw_reward"] == pytest.approx(0.5)
    assert m["rollout/truncated_ratio"] == pytest.approx(1 / 6)
    assert m["rollout/zero_std/count_1.0"] == 1.0 and m["rollout/zero_std/count_0.0"] == 1.0
    assert m["perf/rollout_time"] == 2.0 and m["perf/tokens_per_sec"] == 8.0


def test_custom_log_hook_can_skip_default():
    calls = []

    def hook(rollout_id, args, samples, extra_metrics, rollout_time):
        calls.append((rollout_id, len(samples), dict(extra_metrics), rollout_time))
        return True

    ds = SimpleNamespace(get_buffer_length=lambda: 3)
    ctx = RolloutContext(rollout_id=2, samples=_samples([1, 0]), rollout_time=0.5,
                         extra_metrics={"rollout/dynamic_filter/drop_zero_std_1.0": 2})
    log_stage(ctx, StageParts(args=_args(), data_source=ds, rollout_fn=None, plugins={"rollout_log": hook}))
    assert calls == [(2, 2, {"rollout/dynamic_filter/drop_zero_std_1.0": 2}, 0.5)]
    assert "rollout/raw_reward" not in ctx.metrics
    assert ctx.metrics["rollout/dynamic_filter/drop_zero_std_1.0"] == 2
    assert ctx.metrics["rollout/buffer_size"] == 3.0
    ctx2 = RolloutContext(rollout_id=2, samples=_samples([1, 0]), rollout_time=0.5)
    log_stage(ctx2, StageParts(args=_args(), data_source=ds, rollout_fn=None, plugins={"rollout_log": lambda *a: False}))
    assert ctx2.metrics["rollout/raw_reward"] == 0.5


def test_eval_metrics_and_pass_at_k():
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)
    data = {"math": {"rewards": [1, 0, 0, 0, 1, 1, 0, 0], "truncated": [True, False] * 4, "samples": []}}
    m = eval_metrics(_args(n_samples_per_eval_prompt=4), data)
    assert m["eval/math"] == 3 / 8
    assert m["eval/math-truncated_ratio"] == 0.5
    assert m["eval/math-pass@4"] == 1.0  # both prompts have a correct sample
    assert m["eval/math-pass@1"] == 3 / 8
