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
