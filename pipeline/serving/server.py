"""The SGLang-compatible HTTP server in front of an engine (docs/serving.md).

`SGLangServer` binds 127.0.0.1 on a free port and serves, with aiohttp on the shared rollout
loop (`pipeline.rollout.async_loop`, where the engine's loop-bound state lives):

    POST /generate            SGLang's native generate (pipeline/serving/sglang_api.py)
    GET  /health, /health_generate
    GET  /get_model_info, /model_info, /get_weight_version
    POST /abort_request       {"abort_all": true}: the engine's abort_all
    POST /flush_cache         accepted (nothing is cached across requests here)

Every `/generate` call counts in the rollout (or eval) bound last
(`pipeline.rollout.sample_generate.active_context`), exactly as the default generate does: one
request and its tokens in `rollout/tokens_generated`, the rollout's batch-invariance setting
applied, and once the rollout has aborted (its batch is full) a request answers finish_reason
abort without reaching the engine, while requests in flight get the engine's abort.

The socket is bound synchronously, so the port is known at once, also when the first read of
`args.sglang_router_ip` happens inside a coroutine on the rollout loop (a custom generate): the
server then starts accepting as soon as that coroutine awaits, and connections made before wait
in the listen backlog.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from pipeline.rollout.async_loop import get_loop
from pipeline.rollout.sample_generate import active_context, resolve_tokenizer
from pipeline.serving.sglang_api import (ApiError, GenerateCall, abort_response, build_response, parse_generate,
                                         with_batch_invariance)

__all__ = ["SGLangServer"]

logger = logging.getLogger(__name__)

# largest request body accepted (long input_ids lists of multi-turn prompts)
_MAX_BODY_BYTES = 64 * 1024 * 1024
# seconds start() waits for the server when called off the rollout loop, and close() for its end
_START_TIMEOUT_S = 30.0


class SGLangServer:
    """SGLang's native API on `host`:<free port> in front of the engine `engine_provider()`
    returns (called once, at `start`)."""

    def __init__(self, engine_provider: Callable[[], Any], host: str = "127.0.0.1") -> None:
        self._engine_provider = engine_provider
        self.host = host
        self.port: int | None = None
        self._engine: Any = None
        self._tokenizer: Any = None
        self._tokenizer_ready = False
        self._runner: web.AppRunner | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count()
        # requests answered, for logs and tests
        self.served = 0

    @property
    def url(self) -> str:
        """The base URL (`http://127.0.0.1:<port>`); the server must be started."""
        if self.port is None:
            raise RuntimeError("SGLangServer.url: the server is not started")
        return f"http://{self.host}:{self.port}"

    def start(self) -> int:
        """Start serving (idempotent, thread-safe); returns the port. Off the rollout loop it
        waits until the server accepts; on it, the server accepts once the caller awaits."""
        with self._lock:
            if self.port is not None:
                return self.port
            self._engine = self._engine_provider()
            if self._engine is None:
                raise RuntimeError("the SGLang-compatible endpoint needs an engine; this run built none")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((self.host, 0))
            sock.listen(512)
            sock.setblocking(False)
            self._sock, self._loop = sock, get_loop()
            started = asyncio.run_coroutine_threadsafe(self._serve(sock), self._loop)
            self.port = int(sock.getsockname()[1])
        logger.info("serving SGLang's /generate for engine %s at %s", type(self._engine).__name__, self.url)
        if not self._on_loop():
            try:
                started.result(timeout=_START_TIMEOUT_S)
            except concurrent.futures.TimeoutError:
                raise RuntimeError(f"the SGLang-compatible endpoint did not start within {_START_TIMEOUT_S}s") from None
        return self.port

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    async def _serve(self, sock: socket.socket) -> None:
        app = web.Application(client_max_size=_MAX_BODY_BYTES)
        app.add_routes([
            web.post("/generate", self._generate),
            web.get("/health", self._health), web.get("/health_generate", self._health),
            web.get("/get_model_info", self._model_info), web.get("/model_info", self._model_info),
            web.get("/get_weight_version", self._weight_version),
            web.post("/abort_request", self._abort), web.post("/flush_cache", self._flush),
        ])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner = runner

    def close(self) -> None:
        """Stop serving (idempotent)."""
        with self._lock:
            runner, loop, sock = self._runner, self._loop, self._sock
            self._runner = self._sock = None
            self.port = None
        if runner is not None and loop is not None and loop.is_running() and not self._on_loop():
            try:
                asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=_START_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - closing at the end of a run must not fail it
                logger.warning("SGLang-compatible endpoint: clean-up failed: %r", exc)
        if sock is not None:
            sock.close()

    # ------------------------------------------------------------------ handlers
    async def _tokenizer_of_engine(self) -> Any:
        if not self._tokenizer_ready:
            self._tokenizer = await resolve_tokenizer(None, self._engine)
            self._tokenizer_ready = True
        return self._tokenizer

    def _version(self) -> int:
        return int(getattr(self._engine, "weight_version", 0))

    async def _generate(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError as exc:
            return web.json_response({"error": f"/generate: the body is not JSON: {exc}"}, status=400)
        try:
            tokenizer = await self._tokenizer_of_engine()
            calls, batch = parse_generate(body, tokenizer, f"http-{next(self._ids)}")
            answers = await asyncio.gather(*(self._one(call, tokenizer) for call in calls))
        except ApiError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except ValueError as exc:  # the engine refused the request (e.g. a prompt beyond the model's positions)
            return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=400)
        except Exception as exc:
            logger.exception("SGLang-compatible /generate failed")
            return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=500)
        self.served += len(calls)
        return web.json_response(answers if batch else answers[0])

    async def _one(self, call: GenerateCall, tokenizer: Any) -> dict[str, Any]:
        ctx = active_context()
        if ctx is not None and ctx.aborted:
            return abort_response(call, self._version())
        if ctx is not None:
            call = with_batch_invariance(call, ctx.batch_invariant)
            ctx.requests += 1
            ctx.http_requests += 1
        start = time.perf_counter()
        result = await self._engine.generate(call.request)
        if ctx is not None:
            ctx.tokens_generated += len(result.output_ids)
        return build_response(call, result, tokenizer, self._version(), time.perf_counter() - start)

    async def _health(self, request: web.Request) -> web.Response:
        healthy = await self._engine.health()
        return web.Response(status=200 if healthy else 503)

    async def _model_info(self, request: web.Request) -> web.Response:
        path = getattr(self._engine, "hf_checkpoint", None)
        return web.json_response({"model_path": path, "tokenizer_path": path, "is_generation": True,
                                  "weight_version": str(self._version())})

    async def _weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": str(self._version())})

    async def _abort(self, request: web.Request) -> web.Response:
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            body = {}
        if not isinstance(body, dict) or not body.get("abort_all"):
            return web.json_response({"error": "/abort_request: only {\"abort_all\": true} is supported "
                                               "(the engines abort everything at once)"}, status=400)
        await self._engine.abort_all()
        return web.json_response({"success": True})

    async def _flush(self, request: web.Request) -> web.Response:
        return web.json_response({"success": True})
