"""docs/contracts.md §1: the Sample dataclass."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from pipeline import Sample

FIELDS = [  # slime @624b824 slime/utils/types.py, in order
    ("group_index", None), ("index", None), ("rollout_id", None), ("prompt", ""), ("tokens", []),
    ("multimodal_inputs", None), ("multimodal_train_inputs", None), ("multimodal_train_input_id", None),
    ("apply_chat_template_kwargs", {}), ("response", ""), ("response_length", 0), ("label", None),
    ("reward", None), ("loss_mask", None), ("weight_versions", []), ("rollout_log_probs", None),
    ("rollout_top_p_token_ids", None), ("rollout_top_p_token_offsets", None), ("rollout_routed_experts", None),
    ("remove_sample", False), ("teacher_log_probs", None), ("status", Sample.Status.PENDING), ("metadata", {}),
    ("generate_function_path", None), ("custom_rm_path", None), ("train_metadata", None), ("session_id", None),
    ("non_generation_time", 0.0), ("spec_info", Sample.SpecInfo()), ("prefix_cache_info", Sample.PrefixCacheInfo()),
]


def test_fields_order_and_defaults() -> None:
    s = Sample()
    assert [f.name for f in dataclasses.fields(Sample)] == [name for name, _ in FIELDS]
    assert [getattr(s, name) for name, _ in FIELDS] == [default for _, default in FIELDS]
    assert Sample(1, 2, 3, "p").prompt == "p" and Sample(1, 2, 3).rollout_id == 3
    a, b = Sample(), Sample()
    a.tokens.append(1), a.metadata.update(x=1), a.weight_versions.append("v")
    a.apply_chat_template_kwargs["k"] = 1
    a.spec_info.spec_verify_ct += 1
    a.prefix_cache_info.cached_tokens += 1
    assert b.tokens == [] and b.metadata == {} and b.weight_versions == [] and b.apply_chat_template_kwargs == {}
    assert b.spec_info.spec_verify_ct == 0 and b.prefix_cache_info.cached_tokens == 0


def test_status_values() -> None:
    assert [s.value for s in Sample.Status] == ["pending", "completed", "truncated", "aborted", "failed"]
    assert Sample.Status("aborted") is Sample.Status.ABORTED and Sample.Status.FAILED == "failed"


def test_to_dict_from_dict_json_round_trip_with_unknown_keys() -> None:
    s = Sample(group_index=1, index=2, prompt=[{"role": "user", "content": "x"}], tokens=[1, 2],
               reward={"acc": 1.0}, status=Sample.Status.TRUNCATED, metadata={"a": [1]})
    s.custom_field = {"k": 1}
    d = s.to_dict()
    assert d["status"] == "truncated" and d["custom_field"] == {"k": 1}
    back = Sample.from_dict(json.loads(json.dumps(d)))
    assert back == s and back.status is Sample.Status.TRUNCATED and back.custom_field == {"k": 1}
    assert back.to_dict() == d
    assert Sample.from_dict({"index": 5, "future_key": 3}).future_key == 3


def test_get_reward_value() -> None:
    assert Sample(reward=0.5).get_reward_value(SimpleNamespace(reward_key=None)) == 0.5
    assert Sample(reward=0.5).get_reward_value(None) == 0.5
    assert Sample(reward={"acc": 1, "fmt": 0}).get_reward_value(SimpleNamespace(reward_key="fmt")) == 0
    with pytest.raises(ValueError, match="reward dict has no key 'x'"):
        Sample(reward={"acc": 1}).get_reward_value(SimpleNamespace(reward_key="x"))
    with pytest.raises(ValueError, match="reward_key='acc' is set but the reward is float"):
        Sample(reward=1.0).get_reward_value(SimpleNamespace(reward_key="acc"))


def test_append_response_tokens() -> None:
    s = Sample(tokens=[10, 11])
    s.append_response_tokens(tokens=[1, 2], log_probs=[-0.5, -0.25], text="ab")
    s.append_response_tokens(tokens=[3], trainable=False, text="c")
    assert s.tokens == [10, 11, 1, 2, 3] and s.response == "abc" and s.response_length == 3
    assert s.loss_mask == [1, 1, 0] and s.rollout_log_probs == [-0.5, -0.25, 0.0]
    assert s.status is Sample.Status.PENDING


@pytest.mark.parametrize(("kind", "status"), [("length", "truncated"), ("abort", "aborted"), ("stop", "completed")])
def test_finish_reason_mapping(kind: str, status: str) -> None:
    s = Sample()
    s.append_response_tokens(tokens=[1], meta_info={"finish_reason": {"type": kind}})
    assert s.status is Sample.Status(status)


def test_length_errors() -> None:
    with pytest.raises(ValueError, match="2 log-probs for 1 tokens"):
        Sample().append_response_tokens(tokens=[1], log_probs=[0.0, 0.0])
    s = Sample(tokens=[1, 2], response_length=2, loss_mask=[1])
    with pytest.raises(ValueError, match="loss_mask has 1 entries but response_length is 2"):
        s.append_response_tokens(tokens=[5])
    assert s.tokens == [1, 2] and s.response_length == 2  # nothing changed on error
    t = Sample(response_length=1, rollout_log_probs=[0.1, 0.2])
    with pytest.raises(ValueError, match="rollout_log_probs has 2 entries but response_length is 1"):
        t.append_response_tokens(tokens=[5], log_probs=[0.3])
    v = Sample()
    with pytest.raises(ValueError, match="1 log-probs for 2 tokens"):
        v.append_response_tokens(tokens=[5, 6], log_probs=[0.3])
    assert v.tokens == [] and v.loss_mask is None
    u = Sample()
    u.append_response_tokens(tokens=[1, 2])
    with pytest.raises(ValueError, match="log-probs given now but not for the 2 earlier"):
        u.append_response_tokens(tokens=[3], log_probs=[0.0])


# ----------------------------------------------------------------------------- response growth, turn by turn
def test_array_and_tensor_tokens_become_plain_ints_and_floats() -> None:
    """An engine hands back numpy arrays or torch tensors; the sample keeps plain Python values, so it
    dumps as JSON (rollout dumps, checkpoints) and compares equal to lists."""
    import numpy as np
    import torch

    s = Sample(tokens=[10])
    s.append_response_tokens(tokens=np.array([1, 2], dtype=np.int64),
                             log_probs=np.array([-0.5, -0.25], dtype=np.float32))
    s.append_response_tokens(tokens=torch.tensor([3]), log_probs=torch.tensor([-0.125]))
    assert s.tokens == [10, 1, 2, 3] and [type(t) for t in s.tokens] == [int] * 4
    assert s.rollout_log_probs == [-0.5, -0.25, -0.125] and [type(x) for x in s.rollout_log_probs] == [float] * 3
    assert json.loads(json.dumps(s.to_dict()))["tokens"] == [10, 1, 2, 3]


def test_multi_turn_loss_mask_and_log_probs_line_up_with_the_tokens() -> None:
    """An agent loop: model turn, tool answer, model turn. Each response token keeps its own loss mask
    (1 model, 0 tool) and log-prob (0 for tool tokens), in order (slime's multi-turn contract)."""
    s = Sample(tokens=[100, 101])
    s.append_response_tokens(tokens=[1, 2], log_probs=[-0.1, -0.2])
    s.append_response_tokens(tokens=[3, 4], trainable=False)
    s.append_response_tokens(tokens=[5], log_probs=[-0.3])
    assert s.tokens == [100, 101, 1, 2, 3, 4, 5] and s.response_length == 5
    assert s.loss_mask == [1, 1, 0, 0, 1] and s.effective_response_length == 3
    assert s.rollout_log_probs == [-0.1, -0.2, 0.0, 0.0, -0.3]


def test_a_missing_loss_mask_means_every_earlier_response_token_is_trainable() -> None:
    """loss_mask None: all response tokens train (effective_response_length is response_length); growing
    such a sample writes that out as ones before the new tokens' entries."""
    s = Sample(tokens=[100, 1, 2], response_length=2)
    assert s.effective_response_length == 2
    s.append_response_tokens(tokens=[3], trainable=False)
    assert s.loss_mask == [1, 1, 0] and s.effective_response_length == 2


@pytest.mark.parametrize(("kind", "status"), [("length", "truncated"), ("abort", "aborted"), ("stop", "completed")])
def test_finish_reason_as_a_plain_string(kind: str, status: str) -> None:
    """A custom generate may pass an OpenAI-style finish_reason string instead of SGLang's {"type": ...}."""
    s = Sample()
    s.append_response_tokens(tokens=[1], meta_info={"finish_reason": kind})
    assert s.status is Sample.Status(status)


def test_prefix_cache_counters_each_count_alone() -> None:
    """slime's PrefixCacheInfo.add: each counter adds its own meta_info key, a missing one adds 0; an answer
    with neither key leaves the record unmade (all zero, no object per sample)."""
    s = Sample()
    s.append_response_tokens(tokens=[1], meta_info={"finish_reason": {"type": "stop"}})
    assert vars(s)["prefix_cache_info"] is None
    s.append_response_tokens(tokens=[2], meta_info={"finish_reason": {"type": "stop"}, "cached_tokens": 3})
    assert s.prefix_cache_info == Sample.PrefixCacheInfo(cached_tokens=3, total_prompt_tokens=0)
    t = Sample()
    t.append_response_tokens(tokens=[1], meta_info={"finish_reason": {"type": "stop"}, "prompt_tokens": 5})
    assert t.prefix_cache_info == Sample.PrefixCacheInfo(cached_tokens=0, total_prompt_tokens=5)


# ----------------------------------------------------------------------------- weight versions per token
def test_each_calls_weight_version_covers_its_tokens() -> None:
    """pipeline/samples/versions.py: weight_versions gets one entry per finished call (slime); once the
    response mixes versions, metadata["weight_version_runs"] says which made each token (None: a tool's)."""
    from pipeline.samples.versions import RUNS_KEY, token_versions

    s = Sample(tokens=[100])
    s.append_response_tokens(tokens=[1, 2], meta_info={"finish_reason": {"type": "stop"}, "weight_version": "1"})
    assert s.weight_versions == ["1"] and RUNS_KEY not in s.metadata  # one version: weight_versions says it all
    assert token_versions(s) == [1, 1]
    s.append_response_tokens(tokens=[3], meta_info={"finish_reason": {"type": "stop"}, "weight_version": "2"})
    assert s.weight_versions == ["1", "2"] and s.metadata[RUNS_KEY] == [[1, 2], [2, 1]]
    s.append_response_tokens(tokens=[4, 5], trainable=False)  # a tool's answer: no engine made it
    assert s.metadata[RUNS_KEY] == [[1, 2], [2, 1], [None, 2]] and token_versions(s) == [1, 1, 2, None, None]
    t = Sample()  # a tool answer first, then a call of one version: the tool tokens stay unknown
    t.append_response_tokens(tokens=[1], trainable=False, meta_info={"weight_version": "3"})
    t.append_response_tokens(tokens=[2], meta_info={"finish_reason": {"type": "stop"}, "weight_version": "3"})
    assert token_versions(t) == [None, 3] and t.metadata[RUNS_KEY] == [[None, 1], [3, 1]]


def test_token_weight_versions_of_a_call_the_weights_changed_during() -> None:
    """An engine that reports each token's version (token_weight_versions): those versions are kept per
    token, not the call's final weight_version; weight_versions gets each version the call saw."""
    from pipeline.samples.versions import RUNS_KEY, token_versions

    s = Sample(tokens=[100])
    s.append_response_tokens(tokens=[1, 2, 3], log_probs=[-0.1, -0.2, -0.3], meta_info={
        "finish_reason": {"type": "stop"}, "token_weight_versions": [1, 1, 2], "weight_version": "2"})
    assert s.metadata[RUNS_KEY] == [[1, 2], [2, 1]] and token_versions(s) == [1, 1, 2]
    assert s.weight_versions == ["1", "2"]
    s.index = 7
    before = s.to_dict()
    with pytest.raises(ValueError, match=r"^sample 7: 2 token_weight_versions for 1 tokens$"):
        s.append_response_tokens(tokens=[4], log_probs=[-0.4], meta_info={"token_weight_versions": [2, 2]})
    assert s.to_dict() == before


def test_a_response_without_version_info_leaves_metadata_as_it_was() -> None:
    """No engine version known for any token (a run without weight updates, tool output): no runs are
    stored, so such a run dumps exactly the fields it did before versions were tracked."""
    s = Sample(metadata={"k": 1})
    s.append_response_tokens(tokens=[1, 2], log_probs=[-0.1, -0.2])
    s.append_response_tokens(tokens=[3], trainable=False)
    s.append_response_tokens(tokens=[4], meta_info={"finish_reason": {"type": "stop"}, "weight_version": "default"})
    assert s.metadata == {"k": 1} and s.weight_versions == ["default"]  # SGLang's non-numeric tag, as given


# ----------------------------------------------------------------------------- top-p replay offsets
def test_top_p_offsets_of_consecutive_calls_continue_from_the_last_span() -> None:
    """Each call's offsets start at 0; appended, they are shifted by the ids already kept, so response token i
    still keeps ids[offsets[i]:offsets[i + 1]]."""
    s = Sample(tokens=[100])
    s.append_response_tokens(tokens=[7, 8], log_probs=[-0.1, -0.2],
                             meta_info={"top_p_token_ids": [7, 3, 8], "top_p_token_offsets": [0, 2, 3]})
    s.append_response_tokens(tokens=[9, 4], log_probs=[-0.3, -0.4],
                             meta_info={"top_p_token_ids": [9, 4, 5], "top_p_token_offsets": [0, 1, 3]})
    assert s.rollout_top_p_token_ids == [7, 3, 8, 9, 4, 5] and s.rollout_top_p_token_offsets == [0, 2, 3, 4, 6]
    ids, offsets = s.rollout_top_p_token_ids, s.rollout_top_p_token_offsets
    assert [ids[offsets[i]:offsets[i + 1]] for i in range(s.response_length)] == [[7, 3], [8], [9], [4, 5]]


def test_a_call_that_adds_no_tokens_changes_no_top_p_field() -> None:
    """An answer aborted before its first token may still carry (empty) top-p arrays: nothing is appended,
    so nothing about top-p changes, even on a sample whose earlier tokens had no spans."""
    empty = {"top_p_token_ids": [], "top_p_token_offsets": [0], "finish_reason": {"type": "abort"}}
    s = Sample()
    s.append_response_tokens(tokens=[1], log_probs=[-0.1])
    s.append_response_tokens(tokens=[], meta_info=empty)
    assert s.rollout_top_p_token_ids is None and s.rollout_top_p_token_offsets is None
    assert s.status is Sample.Status.ABORTED and s.tokens == [1]
    t = Sample()
    t.append_response_tokens(tokens=[], meta_info=empty)
    assert t.rollout_top_p_token_ids is None and t.rollout_top_p_token_offsets is None


def test_check_lengths_names_the_top_p_offsets_it_found() -> None:
    """The message gives the number of offsets and the last one (None when there are none) beside the
    response length and the number of ids, so a plugin's mistake can be read off it."""
    with pytest.raises(ValueError, match=r"^sample 3: 3 top-p offsets ending at 5 for response_length 1 and "
                                         r"3 token ids \(expected response_length \+ 1 offsets"):
        Sample(index=3, response_length=1, rollout_top_p_token_ids=[1, 2, 3],
               rollout_top_p_token_offsets=[0, 2, 5]).check_lengths()
    with pytest.raises(ValueError, match=r"^sample None: 0 top-p offsets ending at None for response_length 0 and "
                                         r"0 token ids"):
        Sample(rollout_top_p_token_ids=[], rollout_top_p_token_offsets=[]).check_lengths()


def test_log_probs_still_attached_to_a_graph_are_taken_as_plain_floats_without_a_warning() -> None:
    """A custom generate may score its tokens with a model forward outside no_grad and pass that tensor:
    the sample keeps plain floats (no reference to the graph) and the call warns about nothing."""
    import warnings

    import torch

    scores = torch.tensor([-0.5, -0.25], requires_grad=True) * 1.0
    s = Sample()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.append_response_tokens(tokens=[1, 2], log_probs=scores)
    assert s.rollout_log_probs == [-0.5, -0.25] and [type(x) for x in s.rollout_log_probs] == [float, float]
