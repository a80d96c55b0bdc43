"""`hf`: in-process transformers generation with continuous batching on a decode thread.

Construction is cheap; the model loads on `start()` (called by the first `generate`). One
background thread owns the model and runs `DecodeBatch` steps; requests join the running batch
between decode steps (up to `max_batch_size` rows), so a request submitted mid-generation does
not wait for the batch to drain. `abort_all()` finishes every row submitted before it with
finish_reason "abort" and the tokens generated so far, at the next step boundary.

Output ids include the EOS / stop token that ended a row; the text is decoded with
`skip_special_tokens=True` and keeps a matched stop string (SGLang's `no_stop_trim`), so text
and ids agree. Log-probs: see `pipeline.engines.hf_decode` (log-softmax at temperature).
Per-request seeds drive a per-row `torch.Generator`, so a seeded request samples the same tokens
alone or in any batch (up to float rounding differences from padding); a `batch_invariant`
request also gets log-probs that do not depend on its batch (`hf_decode.log_probs_alone`).
Weight sync (`update_weights`, no reload from disk): the new tensors are copied into the loaded
model in place between two decode steps (the decode thread holds a step lock while it steps), and
the static path's fused copies are refreshed in place (a compiled step sees them too), so every
decode path serves them from the next step on. Requests in flight are not interrupted: their earlier keys/values stay as the old weights
computed them, tokens sampled after the update are the new weights' and carry the new version
(`GenerationResult.weight_versions`), so a request can span two versions.
Supported models: those whose cache is a plain `DynamicCache` of full-attention layers (Llama,
Qwen2, Mistral, ...).

Decode paths (`decode_impl`): "static" (`pipeline.engines.hf_static`: pre-allocated KV cache, a
lean decode step for Llama-family layers, batched sampling; other models fall back to "legacy"
with a warning) and "legacy" (`hf_decode.DecodeBatch`: the transformers forward over a
`DynamicCache`, padded and concatenated as rows join). `compile_decode` runs the static path's
per-layer step through `torch.compile` (one graph for all layers; off by default: see
docs/performance.md for compile time against gain); uncompiled float32 steps use
oneDNN-packed weights (`packed_matmuls`, `hf_lean`), and bfloat16 ones run the work between
the matmuls, and the sampling, on fused C kernels (`native_kernels`,
`pipeline.engines.native_kernels`) where the CPU has AVX-512 and a C compiler is found. Both
prefill with the transformers forward. `dtype` bfloat16 roughly doubles throughput at batch >= 8
on AVX-512 BF16 CPUs and is many times slower on CPUs without bfloat16 kernels; "auto" (the default) picks it only where it
is fast (`pipeline.process.precision`). float32 is the exact reference (greedy outputs of both paths
agree on the bundled eval prompts).

Devices (`device`, `colocate`; `pipeline.engines.hf_device`): on CUDA the model, the decode state
and every row's generator live on the engine's GPU, `dtype: auto` is bfloat16, the static path
runs its plain PyTorch step, and `packed_matmuls` / `native_kernels` switch off with a log line.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import deque
from typing import Any

import torch

from pipeline.engines import native_kernels
from pipeline.engines.assets import default_cache_dir, load_tokenizer, resolve_checkpoint
from pipeline.engines.base import GenerationRequest, GenerationResult
from pipeline.engines.hf_decode import DecodeBatch, Row, log_probs_alone
from pipeline.engines.hf_device import cpu_only, engine_device, engine_dtype
from pipeline.engines.hf_lean import LeanDecoder, native_problem, supports
from pipeline.engines.hf_static import StaticDecodeBatch
from pipeline.engines.weight_sync import copy_into_model, versions_per_token
from pipeline.process.openmp import release_thread_workers
from pipeline.process.precision import AUTO

__all__ = ["HFEngine", "DECODE_IMPLS", "DTYPES"]

# "static": pre-allocated KV cache, lean decode step, batched sampling (hf_static); "legacy":
# the original DynamicCache path (hf_decode.DecodeBatch), kept for comparison and other models
DECODE_IMPLS = frozenset({"static", "legacy"})
# "auto": on CUDA bfloat16; on the CPU bfloat16 where it has fast bfloat16 kernels, else float32
# (pipeline.process.precision)
DTYPES = frozenset({"float32", "bfloat16", "float16", AUTO})

logger = logging.getLogger(__name__)


class HFEngine:
    """In-process transformers engine (see module docstring)."""

    # follows a trainer through update_weights (full state dicts)
    weight_sync = "full"

    def __init__(
        self,
        hf_checkpoint: str,
        cache_dir: str | None = None,
        num_threads: int = 2,
        max_batch_size: int = 48,
        batch_wait_s: float = 0.005,
        dtype: str = "float32",
        attn_implementation: str = "sdpa",
        trust_remote_code: bool = False,
        seed: int = 0,
        decode_impl: str = "static",
        compile_decode: bool = False,
        packed_matmuls: bool = True,
        native_kernels: bool = True,
        device: str = "cpu",
        colocate: bool = False,
        # the SGLang-compatible endpoint in front of this engine (pipeline/serving; read by the run, not here)
        serve_http: bool | str = "auto",
    ) -> None:
        self.serve_http = serve_http
        if decode_impl not in DECODE_IMPLS:
            raise ValueError(f"engine.decode_impl must be one of {sorted(DECODE_IMPLS)}, got {decode_impl!r}")
        if dtype not in DTYPES:
            raise ValueError(f"engine.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        for key, value in (("compile_decode", compile_decode), ("packed_matmuls", packed_matmuls),
                           ("native_kernels", native_kernels), ("colocate", colocate)):
            if not isinstance(value, bool):
                raise ValueError(f"engine.{key} must be true or false, got {value!r}")
        self.hf_checkpoint = hf_checkpoint
        self.cache_dir = cache_dir
        self.num_threads = num_threads
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        # "cpu" or "cuda:<index>" (engine.device, engine.colocate: hf_device.engine_device)
        self.device = engine_device(device, colocate)
        self.colocate = colocate
        # the resolved name ("auto" becomes float32 or bfloat16 here)
        self.dtype = engine_dtype(dtype, self.device)
        self.attn_implementation = attn_implementation
        self.trust_remote_code = trust_remote_code
        self.decode_impl = decode_impl
        self.compile_decode = compile_decode
        # CPU-only speed-ups: off on CUDA, with one log line each
        self.packed_matmuls = cpu_only("packed_matmuls", packed_matmuls, self.device)
        self.native_kernels = cpu_only("native_kernels", native_kernels, self.device)
        self._decoder: LeanDecoder | None = None
        # seeds requests that carry no seed of their own
        self._rng = random.Random(seed)
        self.model: Any = None
        self._tokenizer: Any = None
        self._eos_ids: frozenset[int] = frozenset()
        self._max_positions = 0
        self._pending: deque[Row] = deque()
        self._cv = threading.Condition()
        self._abort_epoch = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._fatal: BaseException | None = None
        # held by the decode thread while it steps; update_weights takes it between steps
        self._step_lock = threading.Lock()
        self._batch: DecodeBatch | StaticDecodeBatch | None = None
        self._weight_version = 0
        # counters for benchmarks / metrics
        self.tokens_generated = 0
        self.busy_s = 0.0

    @property
    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer (loaded on first use, without loading the model)."""
        if self._tokenizer is None:
            path = resolve_checkpoint(self.hf_checkpoint, self.cache_dir)
            self._tokenizer = load_tokenizer(path, trust_remote_code=self.trust_remote_code)
        return self._tokenizer

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Load the model and tokenizer and start the decode thread (idempotent)."""
        with self._start_lock:
            if self._thread is not None:
                return
            if self._closed:
                raise RuntimeError("HFEngine is closed")
            torch.set_num_threads(self.num_threads)
            path = resolve_checkpoint(self.hf_checkpoint, self.cache_dir)
            tokenizer = self.tokenizer  # loads it if needed
            self.model = self._load_model(path)
            self._eos_ids = frozenset(_eos_ids(self.model, tokenizer))
            self._max_positions = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
            if self.decode_impl == "static":
                reason = supports(self.model)
                if reason is None:
                    self._decoder = LeanDecoder(self.model, compile=self.compile_decode, packed=self.packed_matmuls)
                    if self.native_kernels:
                        self._attach_native_kernels(self._decoder)
                else:
                    logger.warning("hf engine: %s; using decode_impl=legacy", reason)
            release_thread_workers()  # this thread's OpenMP workers (pipeline.process.openmp): loading is done
            self._thread = threading.Thread(target=self._loop, name="hf-engine-decode", daemon=True)
            self._thread.start()
            logger.info("hf engine ready: %s, %s%s, %s decode%s, %d threads, max batch %d", path, self.dtype,
                        "" if self.device == "cpu" else f" on {self.device}",
                        "static" if self._decoder else "legacy",
                        " (compiled)" if self._decoder and self._decoder.compiled else
                        " (oneDNN-packed matmuls, native kernels)" if self._decoder and self._decoder.native else
                        " (oneDNN-packed matmuls)" if self._decoder and self._decoder.packed else "",
                        self.num_threads, self.max_batch_size)

    def _load_model(self, path: str) -> Any:
        """The checkpoint at `path` in `dtype`, in eval mode, on the engine's device."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, self.dtype), attn_implementation=self.attn_implementation,
            trust_remote_code=self.trust_remote_code,
        ).eval()
        return model if self.device == "cpu" else model.to(self.device)

    def _attach_native_kernels(self, decoder: LeanDecoder) -> None:
        """`native_kernels`: build or load the fused C kernels and hand them to `decoder`, or
        log why its steps keep PyTorch's ops (not this engine's precision or model, no AVX-512,
        no C compiler, a failed build)."""
        reason = native_problem(decoder)
        if reason is None:
            try:
                reason = decoder.use_native(native_kernels.load(self.cache_dir or default_cache_dir()))
            except RuntimeError as exc:
                logger.warning("hf engine: %s; the decode step keeps PyTorch's ops", exc)
                return
        if reason is not None:
            logger.info("hf engine: native decode kernels not used: %s", reason)

    def close(self) -> None:
        """Stop the decode thread; pending requests finish with "abort". Idempotent."""
        with self._cv:
            self._closed = True
            self._abort_epoch += 1
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    # -- Engine API ---------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate for one request (see `pipeline.engines.base.Engine`)."""
        if self._thread is None:
            await asyncio.to_thread(self.start)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Row] = loop.create_future()

        def done(row: Row) -> None:
            try:
                loop.call_soon_threadsafe(_resolve, future, row)
            except RuntimeError:  # the caller's loop is closed: nobody waits for this row
                pass

        row = self._make_row(request, done)
        with self._cv:
            if self._closed:
                raise RuntimeError("HFEngine is closed")
            self._pending.append(row)
            self._cv.notify_all()
        # the caller's thread waits now: its OpenMP workers would cut the decode thread's spin-wait
        release_thread_workers()
        try:
            row = await future
        except asyncio.CancelledError:
            with self._cv:  # stop spending compute on it
                row.abort_epoch = -1
            raise
        if row.error is not None:
            raise row.error
        return self._result(row)

    async def abort_all(self) -> None:
        """Abort every request submitted so far; their `generate` calls return promptly."""
        with self._cv:
            self._abort_epoch += 1
            self._cv.notify_all()

    async def health(self) -> bool:
        """True while the engine can take requests."""
        return not self._closed and self._fatal is None

    # -- weight sync --------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        """The version of the weights served now (0: the checkpoint's)."""
        return self._weight_version

    def update_weights(self, state: Any, version: int) -> None:
        """Copy `state` (HF state-dict names, a subset is fine) into the model in place between
        two decode steps; tokens from the next step on carry `version` (see module docstring)."""
        self.start()
        with self._step_lock:
            copy_into_model(self.model, state, version, self._weight_version)
            if self._decoder is not None:
                self._decoder.refresh()
            for row in self._batch.rows if self._batch is not None else ():
                row.version_marks.append((len(row.output_ids), version))
            self._weight_version = version
        logger.info("hf engine: weights updated to version %d (%d tensors)", version, len(state))

    # -- helpers ------------------------------------------------------------------------------

    def _make_row(self, request: GenerationRequest, on_done: Any) -> Row:
        sp = request.sampling
        if request.input_ids is not None:
            ids = list(request.input_ids)
        elif request.text is not None:
            ids = self.tokenizer.encode(request.text)
        else:
            raise ValueError(f"request {request.request_id}: needs input_ids or text")
        if not ids:
            raise ValueError(f"request {request.request_id}: empty prompt")
        room = self._max_positions - len(ids)
        if room <= 0:
            raise ValueError(
                f"request {request.request_id}: prompt of {len(ids)} tokens exceeds the model's "
                f"{self._max_positions} positions"
            )
        gen = torch.Generator(device=self.device)  # where the row samples (the model's device)
        gen.manual_seed(sp.seed if sp.seed is not None else self._rng.getrandbits(63))
        return Row(
            request_id=request.request_id, prompt_ids=ids, sampling=sp,
            max_new_tokens=max(0, min(sp.max_new_tokens, room)), generator=gen,
            stop_ids=self._eos_ids | frozenset(sp.stop_token_ids), on_done=on_done,
            abort_epoch=self._abort_epoch,
        )

    def _result(self, row: Row) -> GenerationResult:
        text = self.tokenizer.decode(row.output_ids, skip_special_tokens=True)
        assert row.finish_reason is not None
        return GenerationResult(
            request_id=row.request_id, output_ids=list(row.output_ids), text=text,
            finish_reason=row.finish_reason, log_probs=list(row.log_probs),
            weight_versions=versions_per_token(row.version_marks, len(row.output_ids)),
        )

    # -- decode thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        if self.device != "cpu":  # kernels that follow the current device run on the engine's GPU
            torch.cuda.set_device(self.device)
        pad_id = int(self.tokenizer.pad_token_id)
        batch: DecodeBatch | StaticDecodeBatch
        if self._decoder is not None:
            batch = StaticDecodeBatch(self.model, self.tokenizer, pad_id, self._decoder)
        else:
            batch = DecodeBatch(self.model, self.tokenizer, pad_id=pad_id)
        self._batch = batch
        try:
            with torch.inference_mode():
                while True:
                    new = self._wait_for_work(batch)
                    if new is None:
                        break
                    with self._step_lock:
                        t0 = time.perf_counter()
                        before = batch.tokens_generated
                        for row in new:
                            row.version_marks.append((0, self._weight_version))
                        batch.admit(new)
                        self._finish(batch.release_finished())
                        batch.decode()
                        self._finish(batch.release_finished())
                    self.tokens_generated += batch.tokens_generated - before
                    self.busy_s += time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001 - delivered to every waiter
            logger.exception("hf engine decode thread failed")
            self._fatal = exc
            with self._cv:
                rows = list(batch.rows) + list(self._pending)
                self._pending.clear()
            for row in rows:
                row.error = RuntimeError(f"hf engine failed: {exc!r}")
                row.on_done(row)

    def _wait_for_work(self, batch: DecodeBatch | StaticDecodeBatch) -> list[Row] | None:
        """Apply aborts, then take pending rows that fit; None when closed and drained."""
        with self._cv:
            while not batch.rows and not self._pending:
                if self._closed:
                    return None
                # idle: give back this thread's OpenMP workers, so a trainer (or any other thread
                # working meanwhile) spin-waits between its ops alone (pipeline.process.openmp)
                release_thread_workers()
                self._cv.wait()
                if self._pending and self.batch_wait_s > 0:
                    # give concurrent submitters a moment to join this batch
                    self._cv.wait(timeout=self.batch_wait_s)
            epoch = self._abort_epoch
            for row in list(self._pending):
                if row.abort_epoch < epoch:
                    self._pending.remove(row)
                    row.finish_reason = "abort"
                    row.on_done(row)
            for row in batch.rows:
                if row.abort_epoch < epoch:
                    row.finish_reason = "abort"
            new: list[Row] = []
            while self._pending and len(batch.rows) + len(new) < self.max_batch_size:
                row = self._pending.popleft()
                if row.max_new_tokens == 0:
                    row.finish_reason = "length"
                    row.on_done(row)
                    continue
                new.append(row)
        self._finish(batch.release_finished())
        return new

    def _finish(self, rows: list[Row]) -> None:
        """Hand finished rows back; `batch_invariant` ones get their log-probs recomputed alone
        first (an aborted row is cut at a timing-dependent point anyway and is left as it is)."""
        for row in rows:
            if row.sampling.batch_invariant and row.output_ids and row.finish_reason in ("stop", "length"):
                row.log_probs = log_probs_alone(self.model, row)
            row.on_done(row)


def _resolve(future: asyncio.Future[Row], row: Row) -> None:
    if not future.done():
        future.set_result(row)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids
