"""SGLang's native `/generate` API, translated both ways (docs/serving.md).

Request (`POST /generate`, SGLang's `GenerateReqInput`): `text` or `input_ids` (one prompt, or a
list of prompts: a batch), `sampling_params` (one dict, or one per prompt), `return_logprob`,
`rid`, `return_text_in_logprobs`. Sampling keys understood: `temperature`, `top_p`, `top_k`,
`max_new_tokens`, `stop` (a string or a list), `stop_token_ids`, `skip_special_tokens`,
`no_stop_trim`, `sampling_seed` (or our `seed`); keys that only tune SGLang's own server
(`spaces_between_special_tokens`, `custom_params`, ...) are accepted and ignored, and keys whose
meaning an engine here cannot honour (`n` > 1, `ignore_eos`, `min_new_tokens` > 0, `stream`,
`image_data`) are refused with a 400 naming the key.

Response (one object, or a list for a batch): `text`, `output_ids` and `meta_info` with `id`,
`finish_reason` (`{"type": "stop", "matched": <stop string or token id>}`, `{"type": "length",
"length": n}` or `{"type": "abort", "message": ...}`), `prompt_tokens`, `completion_tokens`,
`cached_tokens` (0), `weight_version` (the version of the last token, a string, as SGLang's),
`output_token_logprobs` (with `return_logprob`: `[logprob, token_id, text or None]` per output
token) and **OURS** `token_weight_versions` (one version per output token, which
`Sample.append_response_tokens` folds in; slime's ignores it).

`text` is tokenised with the engine's tokenizer as SGLang does (`tokenizer.encode(text)`, its
special-token default). With `no_stop_trim` false (SGLang's default) the matched stop string and
what follows it are cut from `text`; `output_ids` and the log-probs always hold every token.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pipeline.engines.base import GenerationRequest, GenerationResult, SamplingParams

__all__ = ["SGLANG_DEFAULTS", "ApiError", "GenerateCall", "parse_generate", "build_response", "abort_response",
           "finish_reason", "with_batch_invariance"]

# SGLang's own defaults for a key a request leaves out (sglang/srt/sampling/sampling_params.py)
SGLANG_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 128,
                                   "skip_special_tokens": True, "no_stop_trim": False}
class ApiError(ValueError):
    """A request the endpoint refuses (answered with HTTP 400 and this message)."""


@dataclass
class GenerateCall:
    """One prompt of a `/generate` request: the engine request and how to render its answer."""

    request: GenerationRequest
    return_logprob: bool = False
    logprob_text: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False


def _listify(value: Any, key: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ApiError(f"sampling_params.{key}: expected a string or a list, got {type(value).__name__}")


def _sampling(params: Any) -> tuple[SamplingParams, bool, bool]:
    """(engine params, skip_special_tokens, no_stop_trim) from one `sampling_params` dict."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ApiError(f"sampling_params: expected an object, got {type(params).__name__}")
    if int(params.get("n") or 1) != 1:
        raise ApiError("sampling_params.n: only n=1 is served; send one request per sample")
    if params.get("ignore_eos"):
        raise ApiError("sampling_params.ignore_eos: not supported by the engines behind this endpoint")
    if int(params.get("min_new_tokens") or 0) > 0:
        raise ApiError("sampling_params.min_new_tokens: not supported by the engines behind this endpoint")
    merged = {**SGLANG_DEFAULTS, **{k: v for k, v in params.items() if v is not None}}
    seed = params.get("sampling_seed", params.get("seed"))
    try:
        sampling = SamplingParams(
            temperature=float(merged["temperature"]), top_p=float(merged["top_p"]), top_k=int(merged["top_k"]),
            max_new_tokens=int(merged["max_new_tokens"]), stop=tuple(str(s) for s in _listify(merged.get("stop"), "stop")),
            stop_token_ids=tuple(int(t) for t in _listify(merged.get("stop_token_ids"), "stop_token_ids")),
            seed=None if seed is None else int(seed))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ApiError):
            raise
        raise ApiError(f"sampling_params: {exc}") from None
    if sampling.max_new_tokens < 0:
        raise ApiError(f"sampling_params.max_new_tokens: expected >= 0, got {sampling.max_new_tokens}")
    return sampling, bool(merged["skip_special_tokens"]), bool(merged["no_stop_trim"])


def _prompts(body: dict[str, Any]) -> tuple[list[Any], bool]:
    """The prompts of a request (`text` strings or `input_ids` lists) and whether it is a batch."""
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise ApiError("/generate: give exactly one of text or input_ids")
    if text is not None:
        if isinstance(text, str):
            return [text], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return list(text), True
        raise ApiError("text: expected a string or a non-empty list of strings")
    if isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return [list(ids)], False
    if isinstance(ids, list) and ids and all(isinstance(p, list) and p for p in ids):
        return [list(p) for p in ids], True
    raise ApiError("input_ids: expected a non-empty list of token ids or a list of such lists")


def parse_generate(body: Any, tokenizer: Any, rid: str) -> tuple[list[GenerateCall], bool]:
    """The calls of one `/generate` body (a batch gives several) and whether it was a batch.
    `rid` names the requests when the body has no `rid`; `tokenizer` encodes `text` prompts
    (None: the text goes to the engine as it is)."""
    if not isinstance(body, dict):
        raise ApiError(f"/generate: expected a JSON object, got {type(body).__name__}")
    for key in ("stream", "image_data", "video_data", "audio_data", "lora_path"):
        if body.get(key):
            raise ApiError(f"/generate: {key} is not supported by this endpoint (docs/serving.md)")
    prompts, batch = _prompts(body)
    params = body.get("sampling_params")
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    if len(per_prompt) != len(prompts):
        raise ApiError(f"sampling_params: {len(per_prompt)} entries for {len(prompts)} prompts")
    rids = body.get("rid")
    rids = rids if isinstance(rids, list) else [rids or rid] * len(prompts)
    calls = []
    for i, (prompt, sp) in enumerate(zip(prompts, per_prompt)):
        sampling, skip, no_trim = _sampling(sp)
        request_id = str(rids[i]) if not batch or isinstance(body.get("rid"), list) else f"{rids[i]}-{i}"
        if isinstance(prompt, str) and tokenizer is not None:
            request = GenerationRequest(request_id, input_ids=list(tokenizer.encode(prompt)), sampling=sampling)
        elif isinstance(prompt, str):
            request = GenerationRequest(request_id, text=prompt, sampling=sampling)
        else:
            request = GenerationRequest(request_id, input_ids=[int(t) for t in prompt], sampling=sampling)
        calls.append(GenerateCall(request, bool(body.get("return_logprob")), bool(body.get("return_text_in_logprobs")),
                                  skip, no_trim))
    return calls, batch


def with_batch_invariance(call: GenerateCall, on: bool) -> GenerateCall:
    """`call` asking the engine for batch-invariant log-probs when `on` (the rollout's setting)."""
    if not on:
        return call
    sampling = dataclasses.replace(call.request.sampling, batch_invariant=True)
    return dataclasses.replace(call, request=dataclasses.replace(call.request, sampling=sampling))


def _matched_stop(text: str, stops: tuple[str, ...]) -> tuple[str, int] | None:
    """The stop string found latest in `text` and where it starts (None: none is in it)."""
    best: tuple[str, int] | None = None
    for stop in stops:
        pos = text.rfind(stop) if stop else -1
        if pos >= 0 and (best is None or pos + len(stop) > best[1] + len(best[0])):
            best = (stop, pos)
    return best


def finish_reason(result: GenerationResult, sampling: SamplingParams, text: str,
                  eos_ids: frozenset[int]) -> tuple[dict[str, Any], int | None]:
    """SGLang's `finish_reason` object for `result`, and where a matched stop string starts in
    `text` (None when the answer did not stop on one)."""
    if result.finish_reason == "length":
        return {"type": "length", "length": len(result.output_ids)}, None
    if result.finish_reason == "abort":
        return {"type": "abort", "message": "aborted (the rollout's batch is full, or /abort_request)"}, None
    last = result.output_ids[-1] if result.output_ids else None
    if last is not None and (last in sampling.stop_token_ids or last in eos_ids):
        return {"type": "stop", "matched": int(last)}, None
    found = _matched_stop(text, sampling.stop)
    if found is not None:
        return {"type": "stop", "matched": found[0]}, found[1]
    return {"type": "stop", "matched": None}, None


def _eos_ids(tokenizer: Any) -> frozenset[int]:
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if eos is None:
        return frozenset()
    return frozenset(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))


def build_response(call: GenerateCall, result: GenerationResult, tokenizer: Any, weight_version: int,
                   latency_s: float) -> dict[str, Any]:
    """SGLang's answer to one call. `weight_version`: the version the engine serves, used when
    the result carries no per-token versions."""
    ids = [int(t) for t in result.output_ids]
    if tokenizer is not None:
        text = tokenizer.decode(ids, skip_special_tokens=call.skip_special_tokens)
    else:
        text = result.text
    reason, stop_at = finish_reason(result, call.request.sampling, text, _eos_ids(tokenizer))
    if stop_at is not None and not call.no_stop_trim:
        text = text[:stop_at]
    versions = result.weight_versions if result.weight_versions and len(result.weight_versions) == len(ids) else None
    version = versions[-1] if versions else weight_version
    prompt = call.request.input_ids
    meta: dict[str, Any] = {
        "id": call.request.request_id, "finish_reason": reason,
        "prompt_tokens": len(prompt) if prompt is not None else 0, "completion_tokens": len(ids),
        "cached_tokens": 0, "weight_version": str(version), "e2e_latency": latency_s,
    }
    if versions is not None:
        meta["token_weight_versions"] = [int(v) for v in versions]
    if call.return_logprob:
        log_probs = result.log_probs if result.log_probs is not None and len(result.log_probs) == len(ids) else None
        meta["output_token_logprobs"] = [
            [None if log_probs is None else float(log_probs[i]), tok,
             tokenizer.decode([tok]) if call.logprob_text and tokenizer is not None else None]
            for i, tok in enumerate(ids)]
        meta["input_token_logprobs"] = []
    return {"text": text, "output_ids": ids, "meta_info": meta}


def abort_response(call: GenerateCall, weight_version: int) -> dict[str, Any]:
    """The answer to a call refused because its rollout was aborted before it reached the engine."""
    empty = GenerationResult(call.request.request_id, [], "", "abort", [], [])
    return build_response(call, empty, None, weight_version, 0.0)
