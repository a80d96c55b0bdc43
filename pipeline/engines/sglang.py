"""`sglang`: SGLang's native HTTP API (`/generate`, `/abort_request`, `/health`).

A request is `{"input_ids" | "text", "sampling_params": {...}, "return_logprob": true}` (plus
`rid` so one request can be told apart). The answer's `meta_info.output_token_logprobs` is a list
of `[logprob, token_id, text]`; `meta_info.finish_reason.type` is stop / length / abort.
`abort_all()` posts `{"abort_all": true}` to `/abort_request`: SGLang then answers every in-flight
`/generate` with what it generated so far and finish type "abort" (this is how slime aborts).
Requests still unanswered after `abort_timeout_s` are cancelled and return empty.

Weight sync (`update_weights(state, version)`): the state dict is saved as a Hugging Face folder
`<weight_sync_dir>/v<version>` (`model.safetensors` + the base checkpoint's config files, written
to a temp folder and renamed, older versions pruned) and the server is told to load it with
`POST /update_weights_from_disk {"model_path", "weight_version": "<version>", "flush_cache": true,
"abort_all_requests": false}` (SGLang's `UpdateWeightFromDiskReqInput`); it answers
`{"success", "message"}`. The folder must be readable by the server (a shared disk). Each answer's
`meta_info.weight_version` is the version of its tokens.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping

import httpx

from pipeline.engines.assets import resolve_checkpoint
from pipeline.engines.base import FinishReason, GenerationRequest, GenerationResult
from pipeline.engines.http_util import LoopLocal, with_retries
from pipeline.engines.weight_sync import save_hf_folder
from pipeline.samples.versions import as_version

__all__ = ["SGLangEngine"]

logger = logging.getLogger(__name__)


class SGLangEngine:
    """Client of an SGLang server or router (see module docstring)."""

    # follows a trainer through /update_weights_from_disk (needs weight_sync_dir)
    weight_sync = "full"

    def __init__(
        self,
        base_url: str,
        max_concurrency: int = 64,
        request_timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        abort_timeout_s: float = 10.0,
        skip_special_tokens: bool = False,
        send_rid: bool = True,
        routing_header: str | None = None,
        extra_sampling_params: dict[str, Any] | None = None,
        hf_checkpoint: str | None = None,
        cache_dir: str | None = None,
        weight_sync_dir: str | None = None,
        keep_weight_versions: int = 2,
        update_timeout_s: float = 600.0,
        # the SGLang-compatible endpoint in front of this engine (pipeline/serving; read by the run, not here)
        serve_http: bool | str = "auto",
    ) -> None:
        self.serve_http = serve_http
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.abort_timeout_s = abort_timeout_s
        self.skip_special_tokens = skip_special_tokens
        self.send_rid = send_rid
        self.routing_header = routing_header
        self.extra_sampling_params = dict(extra_sampling_params or {})
        self.hf_checkpoint = hf_checkpoint
        self.cache_dir = cache_dir
        self.weight_sync_dir = weight_sync_dir
        self.keep_weight_versions = keep_weight_versions
        self.update_timeout_s = update_timeout_s
        self._weight_version = 0
        timeout = httpx.Timeout(request_timeout_s, connect=connect_timeout_s)
        self._http = LoopLocal(lambda: httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout,
            limits=httpx.Limits(max_connections=max_concurrency + 4)), max_concurrency)
        self._inflight: dict[asyncio.Task[Any], str] = {}
        self._abort_epoch = 0
        self._closed = False

    def build_payload(self, request: GenerationRequest) -> dict[str, Any]:
        """The `/generate` JSON body for `request`."""
        sp = request.sampling
        params: dict[str, Any] = {
            "temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k,
            "max_new_tokens": sp.max_new_tokens, "stop": list(sp.stop),
            "stop_token_ids": list(sp.stop_token_ids),
            "skip_special_tokens": self.skip_special_tokens,
            # keep the stop string in the text so that text and tokens agree
            "no_stop_trim": True, "spaces_between_special_tokens": False,
        }
        if sp.seed is not None:
            params["sampling_seed"] = sp.seed
        params.update(self.extra_sampling_params)
        payload: dict[str, Any] = {"sampling_params": params, "return_logprob": True}
        if request.input_ids is not None:
            payload["input_ids"] = list(request.input_ids)
        elif request.text is not None:
            payload["text"] = request.text
        else:
            raise ValueError(f"request {request.request_id}: needs input_ids or text")
        if self.send_rid:
            payload["rid"] = request.request_id
        return payload

    @classmethod
    def follow_trainer_problem(cls, engine_cfg: Mapping[str, Any], lora: bool) -> str | None:
        """Pre-flight: the server loads each update from a folder, which must be configured."""
        if not engine_cfg.get("weight_sync_dir"):
            return ("engine=sglang follows a trainer through /update_weights_from_disk: set "
                    "engine.weight_sync_dir to a folder this process writes and the SGLang server reads")
        return None

    @property
    def weight_version(self) -> int:
        """The version the server was last told to load (0: the weights it started with)."""
        return self._weight_version

    def update_weights(self, state: Mapping[str, Any], version: int) -> None:
        """Save `state` as an HF folder and have the server load it (see module docstring);
        raises RuntimeError, keeping the version, when the server refuses."""
        if not isinstance(version, int) or isinstance(version, bool) or version <= self._weight_version:
            raise ValueError(f"update_weights: version must be an int > the current version "
                             f"{self._weight_version}, got {version!r}")
        if not self.weight_sync_dir:
            raise ValueError(self.follow_trainer_problem({}, False))
        base = None
        if self.hf_checkpoint is not None:
            base = resolve_checkpoint(self.hf_checkpoint, self.cache_dir)
        folder = save_hf_folder(state, base, self.weight_sync_dir, version, keep=self.keep_weight_versions)
        body = {"model_path": str(folder), "weight_version": str(version), "flush_cache": True,
                "abort_all_requests": False}
        try:
            resp = httpx.post(f"{self.base_url}/update_weights_from_disk", json=body,
                              timeout=self.update_timeout_s)
            answer = resp.json() if resp.content else {}
        except (httpx.HTTPError, ValueError) as exc:
            raise RuntimeError(f"sglang /update_weights_from_disk at {self.base_url} failed: {exc!r}") from exc
        if not resp.is_success or not answer.get("success", False):
            raise RuntimeError(f"sglang /update_weights_from_disk refused {folder} (HTTP {resp.status_code}): "
                               f"{answer.get('message', resp.text[:300])}")
        self._weight_version = version
        logger.info("sglang engine: server loaded weight version %d from %s", version, folder)

    def parse(self, request_id: str, output: dict[str, Any]) -> GenerationResult:
        """Turn a `/generate` answer into a GenerationResult (its tokens' version: the answer's
        `meta_info.weight_version`, else the version last loaded)."""
        try:
            meta = output["meta_info"]
            items = meta.get("output_token_logprobs") or []
            finish = meta.get("finish_reason")
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"request {request_id}: not an SGLang /generate answer: {output!r:.300}") from exc
        kind = finish.get("type") if isinstance(finish, dict) else finish
        reason: FinishReason = kind if kind in ("stop", "length", "abort") else "stop"
        ids = [int(item[1]) for item in items]
        log_probs = [float(item[0]) if item[0] is not None else 0.0 for item in items]
        version = as_version(meta.get("weight_version"))
        return GenerationResult(request_id, ids, output.get("text") or "", reason,
                                log_probs if items else None,
                                [self._weight_version if version is None else version] * len(ids))

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """POST /generate (see `pipeline.engines.base.Engine`)."""
        if self._closed:
            raise RuntimeError("SGLangEngine is closed")
        payload = self.build_payload(request)
        headers = {self.routing_header: request.session_id} if (
            self.routing_header and request.session_id) else None
        epoch = self._abort_epoch
        task = asyncio.create_task(self._post(payload, headers, request.request_id))
        self._inflight[task] = request.request_id
        try:
            output = await task
        except asyncio.CancelledError:
            if not (task.cancelled() and self._abort_epoch != epoch):
                task.cancel()
                raise
            return GenerationResult(request.request_id, [], "", "abort", [])
        finally:
            self._inflight.pop(task, None)
        return self.parse(request.request_id, output)

    async def _post(self, payload: dict[str, Any], headers: dict[str, str] | None, rid: str) -> Any:
        client, semaphore = self._http.get()

        async def once() -> Any:
            resp = await client.post("/generate", json=payload, headers=headers)
            resp.raise_for_status()
            return resp.json()

        async with semaphore:
            return await with_retries(once, max_retries=self.max_retries, backoff_s=self.backoff_s,
                                      what=f"sglang /generate {rid}")

    async def abort_all(self) -> None:
        """Ask the server to abort everything, then wait for the answers (bounded)."""
        self._abort_epoch += 1
        tasks = list(self._inflight)
        client, _ = self._http.get()
        try:
            resp = await client.post("/abort_request", json={"rid": "", "abort_all": True})
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            logger.warning("sglang /abort_request failed (%r); cancelling requests locally", exc)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self.abort_timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def health(self) -> bool:
        """True when `/health` answers 2xx."""
        if self._closed:
            return False
        client, _ = self._http.get()
        try:
            return (await client.get("/health")).is_success
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        """Close the HTTP client. Idempotent."""
        self._closed = True
        self._http.close()
