"""`openai`: any OpenAI-compatible server through `/v1/completions`.

`dialect` picks the request fields the server understands:
  - `openai`: standard fields; the prompt is sent as token ids; `logprobs` when configured.
  - `vllm`: + `top_k`, `stop_token_ids` and `return_tokens_as_token_ids` (exact output ids).
  - `transformers_serve`: `transformers serve` takes only text prompts, rejects unknown fields,
    samples only when `do_sample` is on and returns no log-probs; sampling goes through its
    `generation_config` JSON field (do_sample, top_k, eos ids, ...).
`extra_body` is merged into every request last.

Responses are streamed (`stream: true`) so that `abort_all()` can return what was received so
far with finish_reason "abort". Output token ids come from `token_id:N` log-prob tokens when the
server gives them (vLLM dialect); otherwise the text is re-tokenized with the checkpoint's
tokenizer (then log-probs are kept only when their count matches). Retries with exponential
backoff cover connection errors, timeouts and 408/429/5xx answers, before any token arrived.

Weight sync: an OpenAI-compatible server cannot take full weights, so this engine follows a
trainer only through vLLM's runtime LoRA loading (server started with `--enable-lora` and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`), with a LoRA trainer and `lora_name` set:
`update_lora(adapter_path, version)` posts `/v1/load_lora_adapter {"lora_name":
"<lora_name>-v<version>", "lora_path": adapter_path}` (a peft adapter folder the server can
read), sends later requests to that adapter (`model`), then unloads the previous one
(`/v1/unload_lora_adapter`). Without it the pre-flight check refuses a trainer.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import httpx

from pipeline.engines.assets import load_tokenizer, resolve_checkpoint
from pipeline.engines.base import FinishReason, GenerationRequest, GenerationResult
from pipeline.engines.http_util import LoopLocal, with_retries

__all__ = ["OpenAIEngine"]

logger = logging.getLogger(__name__)

Dialect = Literal["openai", "vllm", "transformers_serve"]


@dataclass
class _Partial:
    """What one request received so far (survives an abort)."""

    text: str = ""
    tokens: list[str] = field(default_factory=list)
    log_probs: list[float | None] = field(default_factory=list)
    finish: str | None = None
    # the engine's weight version when the request was sent
    version: int = 0

    def reset(self) -> None:
        self.text, self.tokens, self.log_probs, self.finish = "", [], [], None

    def add(self, data: dict[str, Any]) -> None:
        if "error" in data:
            raise RuntimeError(f"server error: {data['error']}")
        choice = data["choices"][0]
        self.text += choice.get("text") or ""
        lp = choice.get("logprobs")
        if lp:
            self.tokens.extend(lp.get("tokens") or [])
            self.log_probs.extend(lp.get("token_logprobs") or [])
        self.finish = choice.get("finish_reason") or self.finish


class OpenAIEngine:
    """Client of an OpenAI-compatible completions server (see module docstring)."""

    # follows a LoRA trainer only, through update_lora (vLLM), when lora_name is set
    weight_sync = "lora"

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        dialect: Dialect = "openai",
        hf_checkpoint: str | None = None,
        cache_dir: str | None = None,
        logprobs: int | None = 1,
        stream: bool = True,
        max_concurrency: int = 32,
        request_timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        completions_path: str = "/v1/completions",
        health_path: str = "/health",
        api_key: str | None = None,
        extra_body: dict[str, Any] | None = None,
        lora_name: str | None = None,
        lora_timeout_s: float = 300.0,
        # the SGLang-compatible endpoint in front of this engine (pipeline/serving; read by the run, not here)
        serve_http: bool | str = "auto",
    ) -> None:
        self.serve_http = serve_http
        if dialect not in ("openai", "vllm", "transformers_serve"):
            raise ValueError(f"engine.dialect must be openai, vllm or transformers_serve; got {dialect!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.dialect = dialect
        self.hf_checkpoint = hf_checkpoint
        self.cache_dir = cache_dir
        self.logprobs = logprobs
        self.stream = stream
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.completions_path = completions_path
        self.health_path = health_path
        self.extra_body = dict(extra_body or {})
        self.lora_name = lora_name
        self.lora_timeout_s = lora_timeout_s
        self._weight_version = 0
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._headers = headers
        timeout = httpx.Timeout(request_timeout_s, connect=connect_timeout_s)
        self._http = LoopLocal(lambda: httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, headers=headers,
            limits=httpx.Limits(max_connections=max_concurrency)), max_concurrency)
        self._tokenizer: Any = None
        self._inflight: set[asyncio.Task[Any]] = set()
        self._abort_epoch = 0
        self._closed = False

    # -- tokenizer (lazy) ---------------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer (for text prompts and re-tokenizing outputs)."""
        if self._tokenizer is None:
            if self.hf_checkpoint is None:
                raise ValueError("engine.hf_checkpoint is needed to convert between text and ids")
            self._tokenizer = load_tokenizer(resolve_checkpoint(self.hf_checkpoint, self.cache_dir))
        return self._tokenizer

    # -- weight sync (LoRA only) ---------------------------------------------------------------

    @classmethod
    def follow_trainer_problem(cls, engine_cfg: Mapping[str, Any], lora: bool) -> str | None:
        """Pre-flight: full weights never; a LoRA adapter when `lora_name` is set."""
        if lora and engine_cfg.get("lora_name"):
            return None
        if lora:
            return ("engine=openai follows a LoRA trainer only through vLLM's /v1/load_lora_adapter: set "
                    "engine.lora_name (and start vLLM with --enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)")
        return ("engine=openai cannot follow a trainer: an OpenAI-compatible server cannot take full weights "
                "(only vLLM LoRA adapters: a LoRA trainer plus engine.lora_name); use engine=hf, ray or "
                "sglang, or trainer=none")

    @property
    def weight_version(self) -> int:
        """The version of the adapter requests go to (0: the served model itself)."""
        return self._weight_version

    def update_weights(self, state: Mapping[str, Any], version: int) -> None:
        """Always refused: this engine cannot take full weights (see `update_lora`)."""
        raise RuntimeError(self.follow_trainer_problem({}, False))

    def update_lora(self, adapter_path: str, version: int) -> None:
        """Load the peft adapter folder `adapter_path` as `<lora_name>-v<version>` and send later
        requests to it; the previous adapter is unloaded (see module docstring)."""
        if not self.lora_name:
            raise RuntimeError(self.follow_trainer_problem({}, True))
        if not isinstance(version, int) or isinstance(version, bool) or version <= self._weight_version:
            raise ValueError(f"update_lora: version must be an int > the current version "
                             f"{self._weight_version}, got {version!r}")
        name = f"{self.lora_name}-v{version}"
        with httpx.Client(base_url=self.base_url, headers=self._headers, timeout=self.lora_timeout_s) as client:
            resp = client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(adapter_path)})
            if not resp.is_success:
                raise RuntimeError(f"{self.base_url}/v1/load_lora_adapter refused {adapter_path} as {name} "
                                   f"(HTTP {resp.status_code}): {resp.text[:300]}")
            previous = self.model if self._weight_version > 0 else None
            self.model, self._weight_version = name, version
            if previous:
                gone = client.post("/v1/unload_lora_adapter", json={"lora_name": previous})
                if not gone.is_success:
                    logger.warning("could not unload LoRA adapter %s (HTTP %d): %s", previous,
                                   gone.status_code, gone.text[:200])
        logger.info("openai engine: requests now go to LoRA adapter %s (version %d)", name, version)

    # -- request building ---------------------------------------------------------------------

    def build_body(self, request: GenerationRequest) -> dict[str, Any]:
        """The JSON body for `request` in this engine's dialect."""
        sp = request.sampling
        body: dict[str, Any] = {"max_tokens": sp.max_new_tokens, "temperature": sp.temperature,
                                "top_p": sp.top_p, "stream": self.stream}
        if self.model is not None:
            body["model"] = self.model
        if sp.stop:
            body["stop"] = list(sp.stop)
        if sp.seed is not None:
            body["seed"] = sp.seed
        if self.dialect == "transformers_serve":
            body["prompt"] = self._prompt_text(request)
            gen = {"do_sample": sp.temperature > 0, "max_new_tokens": sp.max_new_tokens,
                   "eos_token_id": sorted(self._eos_ids(sp.stop_token_ids))}
            if sp.temperature > 0:
                gen.update(temperature=sp.temperature, top_p=sp.top_p, top_k=max(sp.top_k, 0))
            if sp.stop:
                gen["stop_strings"] = list(sp.stop)
            body["generation_config"] = json.dumps(gen)
        else:
            body["prompt"] = list(request.input_ids) if request.input_ids is not None else request.text
            if self.logprobs is not None:
                body["logprobs"] = self.logprobs
            if self.dialect == "vllm":
                body.update(top_k=sp.top_k, stop_token_ids=list(sp.stop_token_ids),
                            return_tokens_as_token_ids=True)
        body.update(self.extra_body)
        return body

    def _prompt_text(self, request: GenerationRequest) -> str:
        if request.input_ids is not None:
            return self.tokenizer.decode(list(request.input_ids), skip_special_tokens=False)
        if request.text is None:
            raise ValueError(f"request {request.request_id}: needs input_ids or text")
        return request.text

    def _eos_ids(self, extra: tuple[int, ...]) -> set[int]:
        ids = set(extra)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    # -- Engine API ---------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Send one completion request (see `pipeline.engines.base.Engine`)."""
        if self._closed:
            raise RuntimeError("OpenAIEngine is closed")
        body = self.build_body(request)
        partial = _Partial(version=self._weight_version)
        epoch = self._abort_epoch
        task = asyncio.create_task(self._exchange(body, partial, request.request_id))
        self._inflight.add(task)
        try:
            await task
        except asyncio.CancelledError:
            if not (task.cancelled() and self._abort_epoch != epoch):
                task.cancel()
                raise
            partial.finish = "abort"
        finally:
            self._inflight.discard(task)
        return self._result(request.request_id, partial)

    async def _exchange(self, body: dict[str, Any], partial: _Partial, rid: str) -> None:
        client, semaphore = self._http.get()

        async def once() -> None:
            partial.reset()
            if not self.stream:
                resp = await client.post(self.completions_path, json=body)
                resp.raise_for_status()
                partial.add(resp.json())
                return
            async with client.stream("POST", self.completions_path, json=body) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    resp.raise_for_status()
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    partial.add(json.loads(payload))

        async with semaphore:
            await with_retries(once, max_retries=self.max_retries, backoff_s=self.backoff_s,
                               what=f"completion {rid} at {self.base_url}")

    def _result(self, rid: str, partial: _Partial) -> GenerationResult:
        finish: FinishReason = {"length": "length", "abort": "abort"}.get(partial.finish or "", "stop")  # type: ignore[assignment]
        ids: list[int] | None = None
        if partial.tokens and all(t.startswith("token_id:") for t in partial.tokens):
            ids = [int(t.split(":", 1)[1]) for t in partial.tokens]
        if ids is None:
            ids = self.tokenizer.encode(partial.text, add_special_tokens=False) if partial.text else []
        log_probs: list[float] | None = None
        if partial.log_probs and len(partial.log_probs) == len(ids):
            log_probs = [float(x) if x is not None else 0.0 for x in partial.log_probs]
        return GenerationResult(rid, ids, partial.text, finish, log_probs, [partial.version] * len(ids))

    async def abort_all(self) -> None:
        """Cancel every in-flight request; each returns finish "abort" with what it received."""
        self._abort_epoch += 1
        tasks = list(self._inflight)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def health(self) -> bool:
        """True when the server answers its health endpoint with 2xx."""
        if self._closed:
            return False
        client, _ = self._http.get()
        try:
            resp = await client.get(self.health_path)
        except httpx.HTTPError:
            return False
        return resp.is_success

    def close(self) -> None:
        """Close the HTTP client. Idempotent."""
        self._closed = True
        self._http.close()
