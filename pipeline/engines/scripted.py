"""A deterministic, model-free engine for unit tests of pipeline logic.

`ScriptedEngine` answers "a + b" style questions (and the bundled word problems) found in the prompt with a short script
("Let me think. ... The answer is \\boxed{N}.") whose content is derived from a private RNG
seeded by the request's sampling seed, or (when no seed is given) by the prompt ids and the
request id. The answer is right with probability `correct_rate`, so rewards vary.

It honours `max_new_tokens` (finish "length"), stop strings / stop token ids (finish "stop"),
an optional per-token delay plus a random (unseeded) jitter on top, so abort, partial rollout
and completion-order independence can be tested, and `abort_all`
(in-flight requests return their partial output with finish "abort"). Log-probs are fake
but deterministic. `update_weights(state, version)` only records the version (the script does not
depend on weights): every token carries the version current when it was emitted, so an update
while a request is in flight (with a token delay) splits its tokens between two versions. With a fixed seed, a request whose input already ends with a prefix of its
script continues the script where it stopped (coherent continuation after an abort).
With `tool_calls: N` (the agent loop's tests and benches) the script for an "a + b" question is a
calculator call (`tool_format`: Hermes `<tool_call>{json}</tool_call>` or `<calculator>a + b</calculator>`)
until the conversation holds N of them, then the number after the last one as the boxed answer.

`ByteTokenizer` is a tiny reversible codec (token id = byte value, plus an EOS id) with the
parts of the Hugging Face tokenizer interface the pipeline uses; tests use it as `tokenizer`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import re
from dataclasses import dataclass
from typing import Any

from pipeline.engines.base import GenerationRequest, GenerationResult

__all__ = ["ByteTokenizer", "ScriptedEngine", "EngineStats", "solve"]

logger = logging.getLogger(__name__)

_SYMBOLIC = re.compile(r"(-?\d+)\s*([+\-*×/]|plus|minus|times|multiplied by|divided by)\s*(-?\d+)")
_NUMBER = re.compile(r"-?\d+")
_OPS = {"+": "+", "plus": "+", "-": "-", "minus": "-", "*": "*", "×": "*", "times": "*",
        "multiplied by": "*", "/": "/", "divided by": "/"}
_FILLER = ("Hmm.", "Ok.", "Let me think.", "Add them.", "Check.", "So.", "Carry the one.", "Right.")


class ByteTokenizer:
    """Reversible byte-level codec: ids 0..255 are UTF-8 bytes, 256 is EOS (and pad).

    Offers the subset of the Hugging Face tokenizer API the pipeline calls:
    `encode`, `decode`, `__call__`, `apply_chat_template`, `get_vocab`, `eos_token_id`,
    `pad_token_id`.
    """

    eos_token_id: int = 256
    pad_token_id: int = 256
    eos_token: str = "<eos>"
    vocab_size: int = 257
    chat_template: str = "byte-chat"

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        """UTF-8 bytes of `text` as ids."""
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True, **_: Any) -> str:
        """Inverse of `encode`; the EOS id is dropped (or rendered as `<eos>`)."""
        out = bytearray()
        for i in ids:
            if 0 <= int(i) < 256:
                out.append(int(i))
            elif not skip_special_tokens:
                out.extend(self.eos_token.encode())
        return out.decode("utf-8", errors="replace")

    def get_vocab(self) -> dict[str, int]:
        """Token string -> id (byte tokens are spelled `<0xNN>`)."""
        vocab = {f"<0x{i:02X}>": i for i in range(256)}
        vocab[self.eos_token] = self.eos_token_id
        return vocab

    def __call__(self, text: str | list[str], add_special_tokens: bool = False, **_: Any) -> dict:
        """`{"input_ids": ...}` for one text or a list of texts."""
        if isinstance(text, list):
            return {"input_ids": [self.encode(t) for t in text]}
        return {"input_ids": self.encode(text)}

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        tools: list[Any] | None = None,
        **_: Any,
    ) -> str | list[int]:
        """A plain, reversible template: `<role>: content` lines, then `assistant:`."""
        lines = []
        if tools:
            lines.append(f"tools: {tools}")
        lines.extend(f"{m['role']}: {m['content']}" for m in messages)
        text = "\n".join(lines) + ("\nassistant: " if add_generation_prompt else "")
        return self.encode(text) if tokenize else text


@dataclass
class EngineStats:
    """Counters tests and benches read: requests, tokens, concurrency, aborts."""

    requests: int = 0
    tokens_generated: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    aborted: int = 0


def solve(text: str) -> int | None:
    """The answer to the first arithmetic question in `text` ("3 + 4", "8 times 8", or the simple
    word problems of the bundled data: "... gets 3 more", "... gave 2 away", "... in each ..."),
    or None when there is none."""
    match = _SYMBOLIC.search(text)
    if match is not None:
        a, op, b = int(match.group(1)), _OPS[match.group(2)], int(match.group(3))
    else:
        nums = [int(x) for x in _NUMBER.findall(text)[:2]]
        if len(nums) < 2:
            return None
        a, b = nums
        lowered = text.lower()
        if "in each" in lowered or "each" in lowered.split():
            op = "*"
        elif " away" in lowered or " left" in lowered:
            op = "-"
        elif " more" in lowered or "total" in lowered:
            op = "+"
        else:
            return None
    if op == "/":
        return a // b if b else None
    return a + b if op == "+" else a - b if op == "-" else a * b


def _stable_seed(*parts: Any) -> int:
    h = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(h[:8], "little")


class ScriptedEngine:
    """Deterministic fake engine (see module docstring)."""

    # takes update_weights (version bookkeeping only)
    weight_sync = "full"

    def __init__(
        self,
        correct_rate: float = 0.5,
        token_delay: float = 0.0,
        token_delay_jitter: float = 0.0,
        max_filler: int = 3,
        seed: int = 0,
        tokenizer: Any = None,
        # the SGLang-compatible endpoint in front of this engine (pipeline/serving; read by the run, not here)
        serve_http: bool | str = "auto",
        tool_calls: int = 0,
        tool_format: str = "hermes",
    ) -> None:
        self.serve_http = serve_http
        if tool_calls < 0:
            raise ValueError(f"engine.tool_calls must be >= 0, got {tool_calls}")
        if tool_format not in ("hermes", "tags"):
            raise ValueError(f"engine.tool_format: expected hermes or tags, got {tool_format!r}")
        # calculator calls the script makes before it answers (the agent loop's tests and benches)
        self.tool_calls = int(tool_calls)
        self.tool_format = tool_format
        if not 0.0 <= correct_rate <= 1.0:
            raise ValueError(f"engine.correct_rate must be in [0, 1], got {correct_rate}")
        if token_delay < 0:
            raise ValueError(f"engine.token_delay must be >= 0 seconds, got {token_delay}")
        if token_delay_jitter < 0:
            raise ValueError(f"engine.token_delay_jitter must be >= 0 seconds, got {token_delay_jitter}")
        if max_filler < 0:
            raise ValueError(f"engine.max_filler must be >= 0, got {max_filler}")
        self.correct_rate = float(correct_rate)
        self.token_delay = float(token_delay)
        self.token_delay_jitter = float(token_delay_jitter)
        # unseeded on purpose: the jitter shuffles completion order from run to run
        self._jitter_rng = random.Random()
        self.max_filler = int(max_filler)
        self.seed = int(seed)
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.stats = EngineStats()
        self._abort_epoch = 0
        self._closed = False
        self._weight_version = 0
        # names of the tensors the last update_weights carried (tests read it)
        self.last_update_names: list[str] = []

    # ------------------------------------------------------------------ weights
    @property
    def weight_version(self) -> int:
        """The version set by the last `update_weights` (0 before any)."""
        return self._weight_version

    def update_weights(self, state: Any, version: int) -> None:
        """Record `version` (must move past the current one); the script ignores the tensors."""
        if not isinstance(version, int) or isinstance(version, bool) or version <= self._weight_version:
            raise ValueError(f"update_weights: version must be an int > the current version "
                             f"{self._weight_version}, got {version!r}")
        self.last_update_names = list(state)
        self._weight_version = version

    # ------------------------------------------------------------------ script
    def tool_call_text(self, expression: str) -> str:
        """The calculator call the script writes in `tool_format` (public for tests)."""
        if self.tool_format == "tags":
            return f"<calculator>{expression}</calculator>"
        return '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % expression

    def _tool_script(self, prompt_text: str, rng: random.Random) -> str | None:
        """With `tool_calls`: a calculator call while fewer than that many were made for the last
        user question, then the number the last tool result holds as the boxed answer."""
        question = prompt_text[max(0, prompt_text.rfind("user")):]
        match = _SYMBOLIC.search(question)
        if match is None:
            return None
        call = self.tool_call_text(f"{match.group(1)} {match.group(2)} {match.group(3)}")
        made = prompt_text.count(call)
        if made < self.tool_calls:
            filler = " ".join(rng.choice(_FILLER) for _ in range(rng.randint(0, self.max_filler)))
            return (filler + " " if filler else "") + call
        found = _NUMBER.findall(prompt_text[prompt_text.rfind(call) + len(call):])
        return f"The tool says {found[0]}. The answer is \\boxed{{{found[0]}}}." if found else None

    def script_for(self, prompt_text: str, rng: random.Random) -> str:
        """The full response text for a prompt under `rng` (public for tests)."""
        if self.tool_calls:
            scripted = self._tool_script(prompt_text, rng)
            if scripted is not None:
                return scripted
        filler = " ".join(rng.choice(_FILLER) for _ in range(rng.randint(0, self.max_filler)))
        right = solve(prompt_text)
        if right is None:
            answer = rng.randint(0, 99)
        else:
            answer = right if rng.random() < self.correct_rate else right + rng.choice([-2, -1, 1, 2, 10])
        return (filler + " " if filler else "") + f"The answer is \\boxed{{{answer}}}."

    def _rng_for(self, request: GenerationRequest, prompt_ids: list[int]) -> random.Random:
        if request.sampling.seed is not None:
            return random.Random(_stable_seed(self.seed, request.sampling.seed))
        return random.Random(_stable_seed(self.seed, tuple(prompt_ids), request.request_id))

    # ------------------------------------------------------------------ Engine API
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Emit the scripted response token by token (see module docstring)."""
        if self._closed:
            raise RuntimeError("ScriptedEngine.generate called after close()")
        if request.input_ids is not None:
            prompt_ids = list(request.input_ids)
            prompt_text = self.tokenizer.decode(prompt_ids)
        elif request.text is not None:
            prompt_text = request.text
            prompt_ids = self.tokenizer.encode(prompt_text)
        else:
            raise ValueError(f"request {request.request_id}: neither input_ids nor text given")
        sp = request.sampling
        rng = self._rng_for(request, prompt_ids)
        script = self.script_for(prompt_text, rng)
        script = script[_resume_offset(prompt_text, script):]
        planned = self.tokenizer.encode(script) + [self.tokenizer.eos_token_id]
        epoch = self._abort_epoch
        st = self.stats
        st.requests += 1
        st.in_flight += 1
        st.max_in_flight = max(st.max_in_flight, st.in_flight)
        out: list[int] = []
        logps: list[float] = []
        versions: list[int] = []
        finish = "length"
        try:
            for tok in planned:
                if len(out) >= sp.max_new_tokens:
                    finish = "length"
                    break
                delay = self.token_delay
                if self.token_delay_jitter > 0:
                    delay += self._jitter_rng.uniform(0.0, self.token_delay_jitter)
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._abort_epoch != epoch:
                    finish = "abort"
                    break
                out.append(tok)
                logps.append(-round(rng.random() * 2.0, 6))
                versions.append(self._weight_version)
                st.tokens_generated += 1
                if tok == self.tokenizer.eos_token_id or tok in sp.stop_token_ids:
                    finish = "stop"
                    break
                if sp.stop and any(self.tokenizer.decode(out).endswith(s) for s in sp.stop):
                    finish = "stop"
                    break
            else:
                finish = "stop"
            if self.token_delay == 0 and self.token_delay_jitter == 0:
                await asyncio.sleep(0)  # let other tasks run even without a delay
        finally:
            st.in_flight -= 1
        if finish == "abort":
            st.aborted += 1
        return GenerationResult(
            request_id=request.request_id,
            output_ids=out,
            text=self.tokenizer.decode(out),
            finish_reason=finish,  # type: ignore[arg-type]
            log_probs=logps,
            weight_versions=versions,
        )

    async def abort_all(self) -> None:
        """Every request in flight now returns its partial output with finish "abort"."""
        self._abort_epoch += 1
        await asyncio.sleep(0)

    async def health(self) -> bool:
        """True until `close()`."""
        return not self._closed

    def close(self) -> None:
        """Mark the engine closed. Idempotent."""
        self._closed = True


def _resume_offset(prompt_text: str, script: str) -> int:
    """Length of the longest prefix of `script` that `prompt_text` ends with (0 when none).

    Only prefixes that end a whole character run matter; a short accidental overlap (under
    4 characters) is ignored so a fresh prompt never skips the start of its script.
    """
    for k in range(len(script), 3, -1):
        if prompt_text.endswith(script[:k]):
            return k
    return 0
