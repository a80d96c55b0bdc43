"""Per-sample generation for the engine rollout and eval: the default generate and plugins.

The default generate turns a Sample into a `GenerationRequest` (prompt ids from the sample or
from the injected tokenizer), continues ABORTED samples from their partial tokens with
`max_new_tokens` reduced by what they already have, and grows the response with
`Sample.append_response_tokens`. A custom generate `async fn(args, sample, sampling_params
[, evaluation])` (slime's signature, `sampling_params` a dict with sglang's keys) may replace it
per sample (`sample.generate_function_path`) or per run (config); as in slime it gets
`evaluation=` only when its signature names that parameter. A synchronous one runs in a worker
thread. Plugins that only want to wrap the default can call
`pipeline.rollout.sample_generate.generate(args, sample, sampling_params)`.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import hashlib
import inspect
from dataclasses import dataclass, field
from typing import Any

from pipeline.slime import stand_ins
from pipeline.engines.assets import load_tokenizer, resolve_checkpoint
from pipeline.engines.base import GenerationRequest, SamplingParams
from pipeline.config.plugins import SLOTS_BY_NAME, allowed_targets, load_object, signature_of
from pipeline.rollout.contracts import PluginOutputError, is_sample_like
from pipeline.samples.sample import Sample
from pipeline.samples.meta import coerce_status
from pipeline.samples.versions import RUNS_KEY, mask_older_than_newest

__all__ = [
    "GenContext",
    "generate",
    "default_generate",
    "engine_turn",
    "sampling_params_from_args",
    "to_engine_params",
    "encode_prompt",
    "encode_prompts",
    "sample_seed",
    "continuation_seed",
    "reset_sample",
    "is_finished",
    "call_custom_generate",
    "load_generate_fn",
    "resolve_tokenizer",
    "active_context",
    "release",
]

_CURRENT: contextvars.ContextVar[GenContext] = contextvars.ContextVar("rollout_gen_context")
# the context bound last: requests through the SGLang-compatible endpoint (pipeline/serving) count
# there, since an HTTP handler does not run in the task that bound it
_ACTIVE: list[GenContext] = []
_DONE = (Sample.Status.COMPLETED, Sample.Status.TRUNCATED, Sample.Status.FAILED)


@dataclass
class GenContext:
    """What the default generate needs, shared by every sample of one rollout / eval call."""

    engine: Any
    tokenizer: Any
    rollout_id: int
    # set when the batch is full; samples not yet sent to the engine are left untouched
    aborted: bool = False
    # ask the engine for log-probs that do not depend on batching (rollout.batch_invariant_log_probs)
    batch_invariant: bool = False
    tokens_generated: int = 0
    continued_samples: int = 0
    # tokens given loss mask 0 because a newer version made later tokens of their sample
    offpolicy_tokens_masked: int = 0
    requests: int = 0
    # the agent loop's run for this rollout / eval (`rollout.generate=agent`, pipeline/agent/loop.py);
    # None: single-turn generation
    agent: Any = None
    # of `requests`, those that came through the SGLang-compatible endpoint (pipeline/serving)
    http_requests: int = 0
    _fn_cache: dict[str, Any] = field(default_factory=dict)


async def resolve_tokenizer(tokenizer: Any, engine: Any) -> Any:
    """The injected tokenizer, else the engine's, else one loaded from `engine.hf_checkpoint`."""
    if tokenizer is not None:
        return tokenizer
    if getattr(engine, "tokenizer", None) is not None:
        return engine.tokenizer
    checkpoint = getattr(engine, "hf_checkpoint", None)
    if checkpoint is None:
        return None
    path = await asyncio.to_thread(resolve_checkpoint, checkpoint, getattr(engine, "cache_dir", None))
    return await asyncio.to_thread(load_tokenizer, path)


def is_finished(sample: Any) -> bool:
    """True for COMPLETED / TRUNCATED / FAILED samples (nothing left to generate); any status
    enum member or string counts (a plugin's own Sample class may carry slime's enum)."""
    return coerce_status(sample.status) in _DONE


def sampling_params_from_args(args: Any, overrides: dict | None = None) -> dict:
    """slime-style sampling-params dict (sglang key names) from the run args; non-None
    `overrides` (eval datasets) replace values."""
    params = {
        "temperature": args.rollout_temperature,
        "top_p": args.rollout_top_p,
        "top_k": args.rollout_top_k,
        "max_new_tokens": args.rollout_max_response_len,
        "stop": list(args.rollout_stop or []),
        "stop_token_ids": list(args.rollout_stop_token_ids or []),
        "skip_special_tokens": True,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    for key, value in (overrides or {}).items():
        if value is not None:
            params[key] = value
    return params


def to_engine_params(params: dict, seed: int | None = None) -> SamplingParams:
    """The engine's `SamplingParams` from a slime-style dict (unknown keys are ignored)."""
    top_k = params.get("top_k")
    return SamplingParams(
        temperature=float(params["temperature"]),
        top_p=float(params["top_p"]),
        top_k=-1 if top_k is None else int(top_k),
        max_new_tokens=int(params["max_new_tokens"]),
        stop=tuple(params.get("stop") or ()),
        stop_token_ids=tuple(params.get("stop_token_ids") or ()),
        seed=params["seed"] if params.get("seed") is not None else seed,
    )


def encode_prompt(tokenizer: Any, prompt: str | list[dict[str, Any]], tools: Any = None) -> list[int]:
    """Prompt token ids: a message list is rendered with the chat template first."""
    if tokenizer is None:
        raise ValueError("the rollout needs a tokenizer to encode prompts (none was injected and "
                         "the engine exposes no .tokenizer)")
    if isinstance(prompt, list):
        prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, tools=tools)
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def encode_prompts(tokenizer: Any, samples: list[Sample]) -> None:
    """Fill `tokens` of fresh samples in one batched tokenizer call, so a whole fetch reaches the
    engine in the same instant (staggered submissions make a batching engine decode in more,
    smaller steps)."""
    todo = [s for s in samples if not s.tokens and not s.response_length]
    if not todo or tokenizer is None:
        return
    texts = [s.prompt if isinstance(s.prompt, str) else tokenizer.apply_chat_template(
        s.prompt, tokenize=False, add_generation_prompt=True, tools=s.metadata.get("tools"))
        for s in todo]
    for s, ids in zip(todo, tokenizer(texts, add_special_tokens=False)["input_ids"]):
        s.tokens = list(ids)


def sample_seed(seed: int, group_index: int | None, position: int) -> int:
    """Stable 31-bit seed from (run seed, group index, position in the group)."""
    digest = hashlib.sha256(f"{seed}:{group_index}:{position}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def continuation_seed(seed: int, response_ids: list[int]) -> int:
    """Stable 31-bit seed for continuing a partial sample: from its own seed and the response
    tokens it already has, so the same partial sample always continues the same way."""
    h = hashlib.sha256(f"{seed}:".encode())
    h.update(b",".join(str(int(t)).encode() for t in response_ids))
    return int.from_bytes(h.digest()[:4], "little") & 0x7FFFFFFF


def reset_sample(sample: Sample) -> None:
    """Back to a fresh prompt: drop the response, reward and partial-rollout bookkeeping."""
    if sample.response_length:
        sample.tokens = list(sample.tokens[: len(sample.tokens) - sample.response_length])
    sample.response = ""
    sample.response_length = 0
    sample.loss_mask = None
    sample.rollout_log_probs = None
    sample.rollout_top_p_token_ids = sample.rollout_top_p_token_offsets = None
    sample.rollout_routed_experts = None
    sample.teacher_log_probs = None
    sample.reward = None
    sample.weight_versions = []
    sample.status = Sample.Status.PENDING
    sample.metadata = {k: v for k, v in sample.metadata.items() if k not in ("start_rollout_id", RUNS_KEY)}


async def default_generate(
    ctx: GenContext, args: Any, sample: Sample, sampling_params: dict, evaluation: bool = False
) -> Sample:
    """Generate (or continue) one sample in place with the context's engine (with
    `rollout.generate=agent`: the agent loop of `ctx.agent`, pipeline/agent/loop.py)."""
    if ctx.agent is not None:
        return await ctx.agent.generate(ctx, args, sample, sampling_params, evaluation)
    if ctx.aborted or is_finished(sample):
        return sample
    if not sample.tokens:
        sample.tokens = encode_prompt(ctx.tokenizer, sample.prompt, sample.metadata.get("tools"))
    budget = int(sampling_params["max_new_tokens"]) - sample.response_length
    if budget <= 0:
        sample.status = Sample.Status.TRUNCATED
        return sample
    continued = sample.response_length > 0
    if continued:
        ctx.continued_samples += 1
        if args.mask_offpolicy_in_partial_rollout:
            sample.loss_mask = [0] * sample.response_length
    params = to_engine_params({**sampling_params, "max_new_tokens": budget})
    if ctx.batch_invariant:
        params = dataclasses.replace(params, batch_invariant=True)
    if continued and params.seed is not None:
        response_ids = sample.tokens[len(sample.tokens) - sample.response_length:]
        params = dataclasses.replace(params, seed=continuation_seed(params.seed, response_ids))
    await engine_turn(ctx, args, sample, params)
    if args.mask_offpolicy_in_partial_rollout:
        ctx.offpolicy_tokens_masked += mask_older_than_newest(sample)
    if continued and ctx.tokenizer is not None:
        response_ids = sample.tokens[len(sample.tokens) - sample.response_length:]
        sample.response = ctx.tokenizer.decode(response_ids, skip_special_tokens=True)
    return sample


async def engine_turn(ctx: GenContext, args: Any, sample: Sample, params: SamplingParams) -> Any:
    """One engine request on the sample's tokens; its output is appended as trainable tokens (with
    the engine's log-probs, weight versions and finish reason, which sets the status). Returns the
    engine's `GenerationResult`."""
    ctx.requests += 1
    request = GenerationRequest(
        request_id=f"r{ctx.rollout_id}-s{sample.index}-{ctx.requests}",
        input_ids=list(sample.tokens),
        sampling=params,
        session_id=sample.session_id,
    )
    result = await ctx.engine.generate(request)
    ctx.tokens_generated += len(result.output_ids)
    log_probs = result.log_probs
    if log_probs is not None and sample.rollout_log_probs is None and sample.response_length:
        log_probs = None  # earlier tokens have none; keep the sample consistent
    versions = result.weight_versions
    # an engine that cannot update its weights serves version 0 throughout
    version = versions[-1] if versions else getattr(ctx.engine, "weight_version", 0)
    meta: dict[str, Any] = {"finish_reason": {"type": result.finish_reason}, "weight_version": str(version)}
    if versions is not None and len(versions) == len(result.output_ids):
        meta["token_weight_versions"] = list(versions)
    sample.append_response_tokens(args, tokens=result.output_ids, log_probs=log_probs, meta_info=meta,
                                  text=result.text)
    return result


async def generate(args: Any, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    """The default generate, for custom generate plugins that wrap it (uses the current rollout)."""
    try:
        ctx = _CURRENT.get()
    except LookupError:
        raise RuntimeError("pipeline.rollout.sample_generate.generate called outside a rollout") from None
    return await default_generate(ctx, args, sample, sampling_params, evaluation)


def bind(ctx: GenContext) -> contextvars.Token:
    """Make `ctx` the current context for `generate` (tasks created afterwards inherit it) and
    the one HTTP requests count in (`active_context`)."""
    _ACTIVE[:] = [ctx]
    return _CURRENT.set(ctx)


def release(ctx: GenContext) -> None:
    """`ctx` is done: HTTP requests stop counting in it (and stop seeing its abort)."""
    if _ACTIVE and _ACTIVE[0] is ctx:
        _ACTIVE.clear()


def active_context() -> GenContext | None:
    """The context of the rollout or eval bound last (None before any)."""
    return _ACTIVE[0] if _ACTIVE else None


def _names_evaluation(fn: Any) -> bool:
    """slime's rule: `evaluation` is passed only to a function whose signature names it."""
    sig = signature_of(fn)
    return sig is not None and "evaluation" in sig.parameters


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def load_generate_fn(ctx: GenContext, args: Any, path: str) -> Any:
    """Import a custom generate once per context; the run's `_target_` allowlist applies."""
    if path not in ctx._fn_cache:
        slot = SLOTS_BY_NAME["custom_generate"]
        ctx._fn_cache[path] = load_object(path, allowed_targets(args), slot.where)
    return ctx._fn_cache[path]


async def call_custom_generate(
    fn: Any, path: str, args: Any, sample: Sample, sampling_params: dict, evaluation: bool
) -> Sample | list[Sample]:
    """Call a custom generate and check its output's shape (a Sample or a list of Samples)."""
    params = dict(sampling_params)
    kwargs = {"evaluation": evaluation} if _names_evaluation(fn) else {}
    # where slime is importable the function gets slime's own Sample, and ours comes back
    theirs = stand_ins.to_slime_sample(sample)
    try:
        if _is_async(fn):
            out = await fn(args, theirs, params, **kwargs)
        else:  # a synchronous generate runs in a worker thread, off the rollout's event loop
            out = await asyncio.to_thread(fn, args, theirs, params, **kwargs)
            if inspect.isawaitable(out):
                out = await out
        out = stand_ins.from_slime_sample(out, theirs, sample)
    except Exception as exc:
        exc.add_note(f"raised by the custom generate {path!r} on sample {getattr(sample, 'index', '?')}")
        raise
    if is_sample_like(out):
        return out
    if isinstance(out, list) and out and all(is_sample_like(s) for s in out):
        return out
    raise PluginOutputError(
        f"custom generate {path!r} returned {type(out).__name__}; expected a Sample or a "
        f"non-empty list of Samples (fan-out)"
    )


def snapshot(sample: Sample) -> Sample:
    """A shallow-safe copy of a sample (lists and metadata copied), for resets after fan-out."""
    return dataclasses.replace(
        sample, tokens=list(sample.tokens), metadata=dict(sample.metadata),
        loss_mask=None if sample.loss_mask is None else list(sample.loss_mask),
        rollout_log_probs=None if sample.rollout_log_probs is None else list(sample.rollout_log_probs),
        weight_versions=list(sample.weight_versions),
        spec_info=dataclasses.replace(sample.spec_info),
        prefix_cache_info=dataclasses.replace(sample.prefix_cache_info),
    )
