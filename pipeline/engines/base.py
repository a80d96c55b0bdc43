"""The engine contract: requests in, results out. Engines know nothing of Samples.

Every engine (hf, ray, openai, sglang, scripted) implements `Engine`. The rollout turns a
`GenerationResult` into Sample fields with `Sample.append_response_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

__all__ = ["SamplingParams", "GenerationRequest", "GenerationResult", "Engine", "FinishReason"]

FinishReason = Literal["stop", "length", "abort"]


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
