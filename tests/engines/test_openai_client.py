"""The openai engine against a scripted local server: dialects, retries, concurrency, abort."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from pipeline.engines.base import GenerationRequest, SamplingParams
from pipeline.engines.openai import OpenAIEngine
from tests.engines.fake_server import FakeServer, serve

pytestmark = pytest.mark.timeout(60)


def vllm_answer(path: str, body: dict[str, Any]) -> tuple[int, Any]:
    n = body["max_tokens"]
    ids = [100 + i for i in range(n)]
    return 200, {"choices": [{"text": "x" * n, "finish_reason": "length", "logprobs": {
        "tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * n}}]}


def req(rid: str = "r", n: int = 3, **kw: Any) -> GenerationRequest:
    return GenerationRequest(rid, input_ids=[5, 6, 7], sampling=SamplingParams(max_new_tokens=n, **kw))


def test_vllm_dialect_sends_ids_and_reads_token_ids() -> None:
    with serve(FakeServer(vllm_answer)) as fake:
        engine = OpenAIEngine(fake.url, model="m", dialect="vllm", stream=False)
        res = asyncio.run(engine.generate(req(n=3, top_k=5, stop_token_ids=(9,), seed=1)))
    path, body = fake.requests[0]
    assert path == "/v1/completions"
    assert body["prompt"] == [5, 6, 7] and body["top_k"] == 5 and body["stop_token_ids"] == [9]
    assert body["return_tokens_as_token_ids"] is True and body["seed"] == 1 and body["model"] == "m"
    assert res.output_ids == [100, 101, 102] and res.log_probs == [-0.5] * 3
    assert res.finish_reason == "length" and res.text == "xxx"


def test_transformers_serve_dialect_body(model_path: str) -> None:
    engine = OpenAIEngine("http://127.0.0.1:1", dialect="transformers_serve", hf_checkpoint=model_path)
    body = engine.build_body(req(n=4, temperature=0.8, top_k=7, stop=("\n",)))
    assert isinstance(body["prompt"], str) and "top_k" not in body and "logprobs" not in body
    gen = json.loads(body["generation_config"])
    assert gen["do_sample"] is True and gen["top_k"] == 7 and gen["max_new_tokens"] == 4
    assert engine.tokenizer.eos_token_id in gen["eos_token_id"]
    greedy = json.loads(engine.build_body(req(temperature=0.0))["generation_config"])
    assert greedy["do_sample"] is False


def test_retries_transient_errors_then_succeeds() -> None:
    calls = {"n": 0}

    def flaky(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        calls["n"] += 1
        return (503, {"error": "busy"}) if calls["n"] <= 2 else vllm_answer(path, body)

    with serve(FakeServer(flaky)) as fake:
        engine = OpenAIEngine(fake.url, dialect="vllm", stream=False, backoff_s=0.01)
        res = asyncio.run(engine.generate(req()))
    assert calls["n"] == 3 and res.output_ids == [100, 101, 102]


def test_bounded_retries_and_no_retry_on_client_errors() -> None:
    with serve(FakeServer(lambda p, b: (503, {}))) as fake:
        engine = OpenAIEngine(fake.url, dialect="vllm", stream=False, max_retries=2, backoff_s=0.01)
        with pytest.raises(httpx.HTTPStatusError):
            asyncio.run(engine.generate(req()))
        assert len(fake.requests) == 3
    with serve(FakeServer(lambda p, b: (400, {"detail": "bad"}))) as fake:
        engine = OpenAIEngine(fake.url, dialect="vllm", stream=False, max_retries=2, backoff_s=0.01)
        with pytest.raises(httpx.HTTPStatusError):
            asyncio.run(engine.generate(req()))
        assert len(fake.requests) == 1


def test_timeout_is_retried_then_raised() -> None:
    with serve(FakeServer(vllm_answer, delay_s=0.5)) as fake:
        engine = OpenAIEngine(fake.url, dialect="vllm", stream=False, request_timeout_s=0.1,
                              max_retries=1, backoff_s=0.01)
        with pytest.raises(httpx.TimeoutException):
            asyncio.run(engine.generate(req()))
        assert len(fake.requests) == 2


def test_concurrency_limit() -> None:
    with serve(FakeServer(vllm_answer, delay_s=0.2)) as fake:
        engine = OpenAIEngine(fake.url, dialect="vllm", stream=False, max_concurrency=2)

        async def go() -> list:
            return await asyncio.gather(*(engine.generate(req(f"r{i}")) for i in range(6)))

        results = asyncio.run(go())
    assert len(results) == 6 and fake.max_active == 2


def test_abort_returns_streamed_partial() -> None:
    def stream(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        return 200, [{"choices": [{"text": "ab", "logprobs": {"tokens": [f"token_id:{i}"],
                                                              "token_logprobs": [-0.1]}}]}
                     for i in range(50)]

    with serve(FakeServer(stream, chunk_delay_s=0.05)) as fake:
        engine = OpenAIEngine(fake.url, dialect="vllm")

        async def go() -> Any:
            task = asyncio.create_task(engine.generate(req(n=50)))
            await asyncio.sleep(0.5)
            t0 = time.perf_counter()
            await engine.abort_all()
            res = await task
            assert time.perf_counter() - t0 < 0.5
            return res

        res = asyncio.run(go())
    assert res.finish_reason == "abort"
    assert 0 < len(res.output_ids) < 50 and res.text == "ab" * len(res.output_ids)
    assert res.log_probs == [-0.1] * len(res.output_ids)


def test_unknown_dialect_is_refused() -> None:
    with pytest.raises(ValueError, match="dialect"):
        OpenAIEngine("http://x", dialect="tgi")  # type: ignore[arg-type]


def test_lora_updates_load_the_adapter_route_requests_to_it_and_unload_the_old_one() -> None:
    """vLLM's runtime LoRA protocol: /v1/load_lora_adapter {lora_name, lora_path} answers 200 with
    text; requests then name the adapter as `model`; /v1/unload_lora_adapter drops the old one."""
    loaded: set[str] = set()

    def handler(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/v1/load_lora_adapter":
            if body["lora_name"] in loaded:
                return 400, {"message": f"The lora adapter '{body['lora_name']}' has already been loaded."}
            loaded.add(body["lora_name"])
            return 200, b'"Success: LoRA adapter added successfully."'
        if path == "/v1/unload_lora_adapter":
            loaded.discard(body["lora_name"])
            return 200, b'"Success: LoRA adapter removed successfully."'
        if body["model"] not in loaded | {"base"}:
            return 404, {"error": f"model {body['model']} does not exist"}
        return vllm_answer(path, body)

    with serve(FakeServer(handler)) as fake:
        engine = OpenAIEngine(fake.url, model="base", dialect="vllm", stream=False, lora_name="policy")
        first = asyncio.run(engine.generate(req(n=2)))
        engine.update_lora("/shared/adapters/v1", 1)
        second = asyncio.run(engine.generate(req(n=2)))
        engine.update_lora("/shared/adapters/v2", 2)
        third = asyncio.run(engine.generate(req(n=2)))
    calls = [(p, b) for p, b in fake.requests if "lora" in p]
    assert calls == [("/v1/load_lora_adapter", {"lora_name": "policy-v1", "lora_path": "/shared/adapters/v1"}),
                     ("/v1/load_lora_adapter", {"lora_name": "policy-v2", "lora_path": "/shared/adapters/v2"}),
                     ("/v1/unload_lora_adapter", {"lora_name": "policy-v1"})]
    models = [b["model"] for p, b in fake.requests if p == "/v1/completions"]
    assert models == ["base", "policy-v1", "policy-v2"] and loaded == {"policy-v2"}
    assert (first.weight_versions, second.weight_versions, third.weight_versions) == ([0, 0], [1, 1], [2, 2])
    assert engine.weight_version == 2


def test_openai_engine_refuses_full_weights_and_a_refused_adapter_keeps_the_version() -> None:
    with serve(FakeServer(lambda path, body: (400, {"message": "LoRA is not enabled (--enable-lora)"}))) as fake:
        engine = OpenAIEngine(fake.url, model="base", lora_name="policy")
        with pytest.raises(RuntimeError, match="refused /a as policy-v1 .*HTTP 400.*--enable-lora"):
            engine.update_lora("/a", 1)
        assert engine.weight_version == 0 and engine.model == "base"
    with pytest.raises(RuntimeError, match="cannot follow a trainer: an OpenAI-compatible server cannot take full"):
        engine.update_weights({}, 1)
    with pytest.raises(RuntimeError, match="set engine.lora_name"):
        OpenAIEngine("http://127.0.0.1:9").update_lora("/a", 1)
    assert OpenAIEngine.follow_trainer_problem({"lora_name": "p"}, lora=True) is None
    assert "cannot take full weights" in OpenAIEngine.follow_trainer_problem({"lora_name": "p"}, lora=False)
