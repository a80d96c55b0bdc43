"""docs/contracts.md §1 against slime @624b824: the whole Sample by position and keyword, slime's Status enum,
and append_response_tokens folding an engine's meta_info as slime does."""

from __future__ import annotations

import base64
import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline import Sample
from pipeline.sinks.files import read_samples, write_samples
from tests.data.slime_samples import SlimeStatus, assert_same_sample, every_field, full_sample


def b64(values: list[int]) -> str:
    """What SGLang sends for an int32 meta array."""
    return base64.b64encode(np.asarray(values, dtype="<i4").tobytes()).decode()


def test_every_field_by_position_and_by_keyword() -> None:
    values = every_field(3)
    assert list(values) == [f.name for f in dataclasses.fields(Sample)]
    by_position = Sample(*values.values())
    by_keyword = Sample(**values)
    for name, value in values.items():
        assert getattr(by_position, name) == value, name
        assert getattr(by_keyword, name) == value, name
    assert by_position == by_keyword
    # the positions that broke before: the 8th argument on
    assert Sample(None, None, None, "", [], None, None, "mm-id").multimodal_train_input_id == "mm-id"
    assert Sample(*[None] * 16, [1, 2]).rollout_top_p_token_ids == [1, 2]
    assert Sample(rollout_top_p_token_ids=[1]).rollout_top_p_token_ids == [1]


def test_records_and_their_rates() -> None:
    spec = Sample.SpecInfo(spec_accept_token_num=6, spec_draft_token_num=8, spec_verify_ct=4, completion_token_num=10)
    assert (spec.spec_accept_rate, spec.spec_accept_length) == (0.75, 2.5)
    assert (Sample.SpecInfo().spec_accept_rate, Sample.SpecInfo().spec_accept_length) == (0.0, 0.0)
    assert Sample.SpecInfo.from_dict(spec.to_dict()) == spec and Sample.SpecInfo.from_dict({}) == Sample.SpecInfo()
    cache = Sample.PrefixCacheInfo(cached_tokens=3, total_prompt_tokens=12)
    assert cache.prefix_cache_hit_rate == 0.25 and Sample.PrefixCacheInfo().prefix_cache_hit_rate == 0.0
    assert Sample.PrefixCacheInfo.from_dict({"cached_tokens": 3, "total_prompt_tokens": 12, "new": 1}) == cache
    s = Sample(spec_info={"spec_verify_ct": 2}, prefix_cache_info={"cached_tokens": 1})  # dicts, as in a dump
    assert s.spec_info == Sample.SpecInfo(spec_verify_ct=2) and s.prefix_cache_info.cached_tokens == 1
    with pytest.raises(TypeError, match="Sample.spec_info must be a Sample.SpecInfo or a dict, got int"):
        Sample(spec_info=3)


@pytest.mark.parametrize("given", [SlimeStatus.COMPLETED, "completed", Sample.Status.COMPLETED])
def test_slime_status_enum_and_strings_are_accepted(given: object) -> None:
    s = Sample(status=given)
    assert s.status is Sample.Status.COMPLETED
    t = Sample()
    t.status = given  # as slime's docs and its search-r1 example do in a custom generate
    assert t.status is Sample.Status.COMPLETED
    # comparisons written against slime's class keep working, both ways round
    assert t.status == SlimeStatus.COMPLETED and SlimeStatus.COMPLETED == t.status
    assert t.status != SlimeStatus.ABORTED and t.status == "completed"
    assert {t.status: 1}["completed"] == 1  # hashes like its value string
    assert t.to_dict()["status"] == "completed"
    assert repr(t.status) == "<Status.COMPLETED: 'completed'>"


def test_unknown_status_is_a_clear_error_at_assignment() -> None:
    s = Sample()
    with pytest.raises(ValueError, match=r"sample status 'done' is not a known status; expected Sample.Status "
                                         r"\(ours or slime's\) or one of the strings \['aborted', 'completed'"):
        s.status = "done"
    with pytest.raises(ValueError, match="not a known status"):
        Sample(status=3)
    assert s.status is Sample.Status.PENDING


def test_a_slime_status_set_by_a_plugin_persists(tmp_path) -> None:
    """The crash of issue 12: slime's enum on a sample, then the sample dump (stage 'persist')."""
    samples = [Sample(index=i) for i in range(3)]
    for s, status in zip(samples, (SlimeStatus.COMPLETED, SlimeStatus.TRUNCATED, "aborted")):
        s.status = status
    write_samples(tmp_path / "d.jsonl", samples)
    assert [s.status for s in read_samples(tmp_path / "d.jsonl")] == [
        Sample.Status.COMPLETED, Sample.Status.TRUNCATED, Sample.Status.ABORTED]


def test_to_dict_from_dict_is_lossless_for_every_field() -> None:
    s = full_sample(5)
    d = s.to_dict()
    assert list(d)[:len(every_field(5))] == list(every_field(5))  # field order, then extras
    assert d["status"] == "truncated" and d["spec_info"]["spec_accept_token_num"] == 10
    assert d["prefix_cache_info"] == {"cached_tokens": 4, "total_prompt_tokens": 11}
    text = json.dumps(d)  # JSON-able
    back = Sample.from_dict(json.loads(text))
    assert_same_sample(back, s)
    assert back.to_dict() == d


def test_pickle_and_copies_keep_every_field() -> None:
    """Ray and multiprocessing pickle samples; partial rollouts deep-copy them."""
    import copy
    import pickle

    s = full_sample(2)
    for back in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):
        assert_same_sample(back, s)
        assert back.spec_info is not s.spec_info
    assert pickle.loads(pickle.dumps(Sample.Status.FAILED)) is Sample.Status.FAILED


def test_dump_round_trip_field_by_field(tmp_path) -> None:
    samples = [full_sample(i) for i in range(4)] + [Sample(index=9)]
    write_samples(tmp_path / "rollout_0.jsonl", samples)
    for got, want in zip(read_samples(tmp_path / "rollout_0.jsonl"), samples, strict=True):
        assert_same_sample(got, want)


# ----------------------------------------------------------------------------- meta_info folding
def test_weight_version_and_counters_fold_in_like_slime() -> None:
    s = Sample(tokens=[1, 2])
    meta = {"finish_reason": {"type": "abort"}, "weight_version": "v2", "cached_tokens": 2, "prompt_tokens": 2,
            "completion_tokens": 1}
    s.append_response_tokens(tokens=[3], log_probs=[-0.5], meta_info=meta)
    assert s.weight_versions == ["v2"] and s.status is Sample.Status.ABORTED
    assert s.prefix_cache_info == Sample.PrefixCacheInfo(cached_tokens=2, total_prompt_tokens=2)
    assert s.spec_info == Sample.SpecInfo()  # no speculative decoding: completion tokens are not counted
    spec = {"finish_reason": {"type": "stop"}, "weight_version": "v3", "cached_tokens": 3, "prompt_tokens": 3,
            "spec_accept_token_num": 4, "spec_draft_token_num": 6, "spec_verify_ct": 2, "completion_tokens": 5}
    s.append_response_tokens(SimpleNamespace(sglang_speculative_algorithm="EAGLE"), tokens=[4, 5],
                             log_probs=[-0.1, -0.2], meta_info=spec)
    assert s.weight_versions == ["v2", "v3"] and s.status is Sample.Status.COMPLETED
    assert s.prefix_cache_info == Sample.PrefixCacheInfo(cached_tokens=5, total_prompt_tokens=5)
    assert s.spec_info == Sample.SpecInfo(spec_accept_token_num=4, spec_draft_token_num=6, spec_verify_ct=2,
                                          completion_token_num=5)
    # slime's switch: args.sglang_speculative_algorithm counts completion tokens even without spec keys
    t = Sample()
    t.append_response_tokens(SimpleNamespace(sglang_speculative_algorithm="EAGLE"), tokens=[1],
                             meta_info={"finish_reason": {"type": "length"}, "completion_tokens": 1})
    assert t.spec_info.completion_token_num == 1 and t.status is Sample.Status.TRUNCATED


@pytest.mark.parametrize("args", [None, SimpleNamespace(), SimpleNamespace(sglang_speculative_algorithm=None),
                                  SimpleNamespace(sglang_speculative_algorithm=False)])
def test_spec_info_stays_zero_unless_speculative_decoding_is_on(args) -> None:
    """slime's test_spec_info_only_updated_when_speculative_enabled: the counters are added only under
    args.sglang_speculative_algorithm, even when the engine's meta_info carries them."""
    meta = {"finish_reason": {"type": "stop"}, "spec_accept_token_num": 7, "spec_draft_token_num": 10,
            "spec_verify_ct": 3, "completion_tokens": 9}
    off = Sample()
    off.append_response_tokens(args, tokens=[], meta_info=meta)
    assert off.spec_info == Sample.SpecInfo() and off.status is Sample.Status.COMPLETED
    on = Sample()
    on.append_response_tokens(SimpleNamespace(sglang_speculative_algorithm="EAGLE"), tokens=[], meta_info=meta)
    assert on.spec_info == Sample.SpecInfo(spec_accept_token_num=7, spec_draft_token_num=10, spec_verify_ct=3,
                                           completion_token_num=9)


def test_tool_tokens_with_log_probs_are_refused_as_in_slime() -> None:
    """slime's test_append_response_tokens_rejects_non_trainable_log_probs: tool / environment tokens
    get log-prob 0; log-probs passed for them are a plugin's mistake, refused, changing nothing."""
    s = Sample(tokens=[1], response_length=1, loss_mask=[1], rollout_log_probs=[-0.5])
    with pytest.raises(ValueError, match=r"^sample 4: non-trainable response tokens should not pass rollout log "
                                         r"probabilities: 2 given for 2 tool / environment tokens, whose log-prob is 0"):
        s.index = 4
        s.append_response_tokens(tokens=[7, 8], log_probs=[-0.1, -0.2], trainable=False)
    assert s.tokens == [1] and s.response_length == 1 and s.rollout_log_probs == [-0.5]
    s.append_response_tokens(tokens=[7, 8], trainable=False)
    assert s.rollout_log_probs == [-0.5, 0.0, 0.0] and s.loss_mask == [1, 0, 0]


def test_meta_info_without_finish_reason_or_with_update_terminal_info_off_changes_no_terminal_info() -> None:
    s = Sample()
    s.append_response_tokens(tokens=[1], meta_info={"weight_version": "v1", "cached_tokens": 5})
    s.append_response_tokens(tokens=[2], meta_info={"finish_reason": {"type": "stop"}, "weight_version": "v2"},
                             update_terminal_info=False)
    assert s.weight_versions == [] and s.status is Sample.Status.PENDING
    assert vars(s)["prefix_cache_info"] is None  # never made: no extra object per sample


@pytest.mark.parametrize("encode", [b64, list, np.asarray])
def test_top_p_spans_extend_and_tool_tokens_get_empty_spans(encode) -> None:
    s = Sample(tokens=[100])
    s.append_response_tokens(tokens=[7, 8], log_probs=[-0.1, -0.2], meta_info={
        "top_p_token_ids": encode([7, 3, 8]), "top_p_token_offsets": encode([0, 2, 3]),
        "finish_reason": {"type": "stop"}})
    assert (s.rollout_top_p_token_ids, s.rollout_top_p_token_offsets) == ([7, 3, 8], [0, 2, 3])
    s.append_response_tokens(tokens=[50, 51], trainable=False)  # a tool answer: nothing kept
    assert s.rollout_top_p_token_offsets == [0, 2, 3, 3, 3] and s.loss_mask == [1, 1, 0, 0]
    s.append_response_tokens(tokens=[9], log_probs=[-0.3], meta_info={  # slime's other key names
        "top_p_kept_token_ids": encode([9, 1, 2]), "top_p_kept_token_offsets": encode([0, 3])})
    assert s.rollout_top_p_token_ids == [7, 3, 8, 9, 1, 2] and s.rollout_top_p_token_offsets == [0, 2, 3, 3, 3, 6]
    offsets, ids = s.rollout_top_p_token_offsets, s.rollout_top_p_token_ids
    kept = [ids[offsets[i]:offsets[i + 1]] for i in range(s.response_length)]
    assert kept == [[7, 3], [8], [], [], [9, 1, 2]]


def test_top_p_errors_change_nothing() -> None:
    s = Sample()
    s.append_response_tokens(tokens=[1], log_probs=[-1.0], meta_info={"top_p_token_ids": [1],
                                                                       "top_p_token_offsets": [0, 1]})
    before = s.to_dict()
    cases = [
        ({"top_p_token_ids": [1]}, "needs both token ids and offsets, got only ids"),
        ({"top_p_token_ids": [1], "top_p_token_offsets": [1, 1]}, r"must start with 0, got \[1\]"),
        ({"top_p_token_ids": [1, 2], "top_p_token_offsets": [0, 1]}, "end at 1 but there are 2 token ids"),
        ({"top_p_token_ids": [1], "top_p_token_offsets": [0, 0, 1]}, "3 top-p offsets for 1 new tokens"),
        ({"top_p_token_ids": base64.b64encode(b"\1\0\0").decode()}, "3 bytes are not whole int32 values"),
        ({"top_p_token_ids": "AQ#AAA=="}, r"meta_info\['top_p_token_ids'\]: not base64 int32 values"),
        ({}, "1 trainable tokens without top-p spans, but the sample replays top-p"),
    ]
    for meta, message in cases:
        with pytest.raises(ValueError, match=message):
            s.append_response_tokens(tokens=[2], log_probs=[-1.0], meta_info=meta)
        assert s.to_dict() == before
    t = Sample()
    t.append_response_tokens(tokens=[1])
    with pytest.raises(ValueError, match="top-p spans given now but not for the 1 earlier response tokens"):
        t.append_response_tokens(tokens=[2], meta_info={"top_p_token_ids": [2], "top_p_token_offsets": [0, 1]})


def test_routed_experts_are_shaped_and_spliced() -> None:
    args = SimpleNamespace(num_layers=2, moe_router_topk=1)
    s = Sample(tokens=[1, 2])  # routing rows cover every token but the last: 2 + 1 - 1 = 2
    s.append_response_tokens(args, tokens=[3], meta_info={"routed_experts": b64([0, 1, 2, 3])})
    assert s.rollout_routed_experts == [[[0], [1]], [[2], [3]]]
    s.append_response_tokens(args, tokens=[4], meta_info={"routed_experts": [5, 6], "routed_experts_start_len": 2})
    assert s.rollout_routed_experts == [[[0], [1]], [[2], [3]], [[5], [6]]]
    with pytest.raises(ValueError, match="routed_experts element count 3 does not match 4 tokens x 2 layers x top-1"):
        s.append_response_tokens(args, tokens=[5], meta_info={"routed_experts": [1, 2, 3]})
    with pytest.raises(ValueError, match=r"args.num_layers and args.moe_router_topk are needed"):
        s.append_response_tokens(None, tokens=[5], meta_info={"routed_experts": [1, 2]})
    assert s.tokens == [1, 2, 3, 4]


def test_check_lengths_covers_top_p() -> None:
    with pytest.raises(ValueError, match="top-p replay needs both"):
        Sample(rollout_top_p_token_ids=[1]).check_lengths()
    with pytest.raises(ValueError, match="2 top-p offsets ending at 1 for response_length 0 and 1 token ids"):
        Sample(rollout_top_p_token_ids=[1], rollout_top_p_token_offsets=[0, 1]).check_lengths()
    Sample(response_length=1, rollout_top_p_token_ids=[1], rollout_top_p_token_offsets=[0, 1]).check_lengths()


def test_foreign_samples_with_slime_status_are_read_everywhere() -> None:
    """A plugin's own Sample class (accepted by shape) may carry slime's enum."""
    from pipeline.rollout.sample_generate import is_finished

    assert is_finished(SimpleNamespace(status=SlimeStatus.COMPLETED))
    assert not is_finished(SimpleNamespace(status=SlimeStatus.ABORTED)) and is_finished(SimpleNamespace(status="failed"))
