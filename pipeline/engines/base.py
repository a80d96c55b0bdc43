"""The engine contract: requests in, results out. Engines know nothing of Samples.

Every engine (hf, ray, openai, sglang, scripted) implements `Engine`. The rollout turns a
`GenerationResult` into Sample fields with `Sample.append_response_tokens`.

Weight sync (a trainer closes the loop): an engine that can follow a trainer has
`weight_sync = "full"` and `update_weights(state, version)` (full Hugging Face state-dict names,
LoRA already merged; a subset of names updates only those tensors) plus a `weight_version`
property; the openai engine has `weight_sync = "lora"` when a LoRA adapter name is configured and
takes `update_lora(adapter_path, version)` instead. Versions start at 0 (the checkpoint's own
weights) and every `GenerationResult.weight_versions` says which version made each token.
`follow_trainer_problem(engine_cls, engine_cfg, lora)` is the pre-flight check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Protocol, runtime_checkable

__all__ = ["SamplingParams", "GenerationRequest", "GenerationResult", "Engine", "FinishReason",
           "WeightSync", "follow_trainer_problem", "check_update"]

FinishReason = Literal["stop", "length", "abort"]
# how an engine follows a trainer: full state dicts, a LoRA adapter folder, or not at all
WeightSync = Literal["full", "lora"] | None


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters understood by every engine."""

    temperature: float = 1.0
    top_p: float = 1.0
    # top_k <= 0 means "no top-k cut"
    top_k: int = -1
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    # per-request seed; None means engine-chosen randomness
    seed: int | None = None
    # log-probs must not depend on what the request was batched with: the hf engine recomputes a
    # finished request's log-probs alone (batch of one, no padding; with a seed its tokens depend
    # on the batch only through float rounding of the logits); remote engines ignore it (their
    # server decides, e.g. SGLang's --enable-deterministic-inference)
    batch_invariant: bool = False


@dataclass
class GenerationRequest:
    """One generation request: prompt token ids (preferred) or text, plus sampling params."""

    request_id: str
    input_ids: list[int] | None = None
    text: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # routing key for engines that keep per-session caches
    session_id: str | None = None


@dataclass
class GenerationResult:
    """What an engine returns for one request."""

    request_id: str
    output_ids: list[int]
    text: str
    finish_reason: FinishReason
    # one log-prob per output id, or None when the engine cannot give them
    log_probs: list[float] | None = None
    # the weight version that made each output id (None: the engine cannot say)
    weight_versions: list[int] | None = None


@runtime_checkable
class Engine(Protocol):
    """A generation engine. All methods are coroutines except `close`."""

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate for one request; returns finish_reason "abort" with the partial output
        when `abort_all` is called while it is in flight."""
        ...

    async def abort_all(self) -> None:
        """Abort every in-flight request; their `generate` calls return promptly."""
        ...

    async def health(self) -> bool:
        """True when the engine can take requests."""
        ...

    def close(self) -> None:
        """Release resources (threads, actors, HTTP clients). Idempotent."""
        ...


def follow_trainer_problem(engine_cls: Any, engine_cfg: Mapping[str, Any], lora: bool) -> str | None:
    """Why an engine of class `engine_cls` built from `engine_cfg` cannot follow a trainer (one
    that trains a LoRA adapter when `lora`), or None when it can. An engine class answers through
    its `follow_trainer_problem(engine_cfg, lora)` classmethod, else through its `weight_sync`."""
    ask = getattr(engine_cls, "follow_trainer_problem", None)
    if callable(ask):
        return ask(engine_cfg, lora)
    name = getattr(engine_cls, "__name__", str(engine_cls))
    sync = getattr(engine_cls, "weight_sync", None)
    if sync == "full":
        return None
    if sync == "lora" and lora:
        return None
    return (f"engine {name} cannot take weights from a trainer (it has no update_weights); use "
            f"engine=hf, ray, sglang or scripted, or trainer=none")


def check_update(current: Mapping[str, Any], state: Mapping[str, Any], version: int, at: int) -> None:
    """Raise ValueError, before anything is copied, when `state` names a tensor the model does not
    have or one of another shape, or when `version` does not move past the current one `at`.
    `current` maps state-dict names to the model's tensors."""
    if not isinstance(version, int) or isinstance(version, bool) or version <= at:
        raise ValueError(f"update_weights: version must be an int > the current version {at}, got {version!r}")
    unknown = sorted(k for k in state if k not in current)
    if unknown:
        raise ValueError(f"update_weights: {len(unknown)} names the model does not have, e.g. {unknown[:3]} "
                         f"(expected Hugging Face state-dict names such as {next(iter(current), '?')!r})")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(current[name].shape):
            raise ValueError(f"update_weights: {name} has shape {tuple(tensor.shape)}, the model's is "
                             f"{tuple(current[name].shape)}")
