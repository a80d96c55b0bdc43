"""SGLang's /generate JSON <-> the engine contract, both ways (pipeline/serving/sglang_api.py)."""

from __future__ import annotations

import pytest

from pipeline.engines.base import GenerationResult
from pipeline.engines.scripted import ByteTokenizer
from pipeline.serving.sglang_api import ApiError, abort_response, build_response, parse_generate

TOK = ByteTokenizer()


def test_text_is_tokenised_and_sampling_params_translated():
    body = {"text": "Q: hi", "sampling_params": {"temperature": 0.5, "top_p": 0.9, "top_k": 7, "max_new_tokens": 12,
                                                  "stop": "</search>", "stop_token_ids": [3], "sampling_seed": 11,
                                                  "spaces_between_special_tokens": False},
            "return_logprob": True, "rid": "abc"}
    (call,), batch = parse_generate(body, TOK, "fallback")
    assert not batch
    req = call.request
    assert req.request_id == "abc" and req.input_ids == list(b"Q: hi") and req.text is None
    sp = req.sampling
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens) == (0.5, 0.9, 7, 12)
    assert sp.stop == ("</search>",) and sp.stop_token_ids == (3,) and sp.seed == 11
    assert call.return_logprob and call.skip_special_tokens and not call.no_stop_trim


def test_sglang_defaults_apply_and_batches_get_one_call_per_prompt():
    (call,), _ = parse_generate({"input_ids": [1, 2, 3]}, TOK, "r7")
    assert call.request.input_ids == [1, 2, 3] and call.request.request_id == "r7"
    assert call.request.sampling.max_new_tokens == 128 and call.request.sampling.temperature == 1.0
    assert not call.return_logprob
    calls, batch = parse_generate({"input_ids": [[1], [2, 3]], "sampling_params": [{"seed": 1}, {"seed": 2}]},
                                  TOK, "b")
    assert batch and [c.request.input_ids for c in calls] == [[1], [2, 3]]
    assert [c.request.sampling.seed for c in calls] == [1, 2]
    assert calls[0].request.request_id != calls[1].request.request_id
    (call,), _ = parse_generate({"text": "x"}, None, "r")  # no tokenizer: the text goes to the engine
    assert call.request.text == "x" and call.request.input_ids is None


@pytest.mark.parametrize("body, match", [
    ({}, "exactly one of text or input_ids"),
    ({"text": "a", "input_ids": [1]}, "exactly one of text or input_ids"),
    ({"input_ids": []}, "input_ids: expected"),
    ({"text": "a", "stream": True}, "stream is not supported"),
    ({"text": "a", "sampling_params": {"n": 2}}, "only n=1"),
    ({"text": "a", "sampling_params": {"ignore_eos": True}}, "ignore_eos"),
    ({"text": "a", "sampling_params": {"max_new_tokens": "many"}}, "sampling_params"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "1 entries for 2 prompts"),
    ([1, 2], "expected a JSON object"),
])
def test_requests_the_engines_cannot_honour_are_refused_by_name(body, match):
    with pytest.raises(ApiError, match=match):
        parse_generate(body, TOK, "r")


def _call(stop=(), no_stop_trim=True, logprob=True, text_in_logprobs=False):
    body = {"input_ids": [1], "sampling_params": {"stop": list(stop), "no_stop_trim": no_stop_trim},
            "return_logprob": logprob, "return_text_in_logprobs": text_in_logprobs}
    return parse_generate(body, TOK, "r")[0][0]


def test_a_stop_string_answer_keeps_the_string_with_no_stop_trim_and_names_it():
    ids = list(b"look it up</search>")
    result = GenerationResult("r", ids, "ignored", "stop", [-0.5] * len(ids), [2] * len(ids))
    out = build_response(_call(stop=["</answer>", "</search>"]), result, TOK, 9, 0.1)
    assert out["text"] == "look it up</search>" and out["output_ids"] == ids
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": "</search>"}
    assert meta["output_token_logprobs"] == [[-0.5, t, None] for t in ids]
    assert meta["weight_version"] == "2" and meta["token_weight_versions"] == [2] * len(ids)
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (1, len(ids), 0)
    trimmed = build_response(_call(stop=["</search>"], no_stop_trim=False), result, TOK, 9, 0.1)
    assert trimmed["text"] == "look it up" and trimmed["output_ids"] == ids  # SGLang trims the text only


def test_eos_length_and_abort_finish_reasons():
    eos = GenerationResult("r", [104, 105, TOK.eos_token_id], "hi", "stop", [-1.0, -1.0, -1.0], None)
    out = build_response(_call(text_in_logprobs=True), eos, TOK, 4, 0.0)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": TOK.eos_token_id}
    assert out["text"] == "hi"  # skip_special_tokens (SGLang's default) drops the EOS from the text
    assert [e[2] for e in out["meta_info"]["output_token_logprobs"]] == ["h", "i", ""]
    assert out["meta_info"]["weight_version"] == "4" and "token_weight_versions" not in out["meta_info"]
    length = GenerationResult("r", [104, 105], "hi", "length", None, [1, 1])
    out = build_response(_call(), length, TOK, 4, 0.0)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    assert out["meta_info"]["output_token_logprobs"] == [[None, 104, None], [None, 105, None]]
    aborted = abort_response(_call(), 3)
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort"
    assert aborted["output_ids"] == [] and aborted["meta_info"]["output_token_logprobs"] == []
    assert aborted["meta_info"]["weight_version"] == "3"
    without = build_response(_call(logprob=False), length, TOK, 4, 0.0)
    assert "output_token_logprobs" not in without["meta_info"]
