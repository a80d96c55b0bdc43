"""The sglang engine against protocol responses served by a local scripted server.

The fixtures in tests/fixtures/sglang/ follow SGLang's native `/generate` answer format
(`text`, `output_ids`, `meta_info.finish_reason`, `meta_info.output_token_logprobs` as
`[logprob, token_id, text]`); their token ids and log-probs come from the bundled model.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.engines.base import GenerationRequest, SamplingParams
from pipeline.engines.sglang import SGLangEngine
from tests.engines.fake_server import FakeServer, serve

pytestmark = pytest.mark.timeout(60)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def request_from_fixture(fx: dict[str, Any]) -> GenerationRequest:
    sp = fx["request"]["sampling_params"]
    return GenerationRequest(fx["request"]["rid"], input_ids=fx["request"]["input_ids"],
                             sampling=SamplingParams(
                                 temperature=sp["temperature"], top_p=sp["top_p"], top_k=sp["top_k"],
                                 max_new_tokens=sp["max_new_tokens"], stop=tuple(sp["stop"]),
                                 stop_token_ids=tuple(sp["stop_token_ids"]),
                                 seed=sp.get("sampling_seed")))


@pytest.mark.parametrize("name,reason", [("generate_length", "length"), ("generate_stop", "stop")])
def test_generate_round_trip(name: str, reason: str) -> None:
    fx = load(name)

    def handler(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        return (200, fx["response"]) if path == "/generate" else (404, {})

    with serve(FakeServer(handler)) as fake:
        engine = SGLangEngine(fake.url)
        res = asyncio.run(engine.generate(request_from_fixture(fx)))
        assert asyncio.run(engine.health()) is False  # the fake has no /health
    path, body = fake.requests[0]
    assert path == "/generate" and body == fx["request"]  # the payload SGLang expects
    items = fx["response"]["meta_info"]["output_token_logprobs"]
    assert res.output_ids == [i[1] for i in items] == fx["response"]["output_ids"]
    assert res.log_probs == pytest.approx([i[0] for i in items])
    assert res.finish_reason == reason and res.text == fx["response"]["text"]


def test_abort_all_posts_abort_request_and_returns_partial() -> None:
    fx = load("generate_abort")
    aborted = threading.Event()

    def handler(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/abort_request":
            assert body["abort_all"] is True
            aborted.set()
            return 200, {}
        aborted.wait(10)  # SGLang answers an in-flight request when it is aborted
        return 200, fx["response"]

    with serve(FakeServer(handler)) as fake:
        engine = SGLangEngine(fake.url)

        async def go() -> Any:
            task = asyncio.create_task(engine.generate(request_from_fixture(fx)))
            await asyncio.sleep(0.3)
            t0 = time.perf_counter()
            await engine.abort_all()
            res = await task
            assert time.perf_counter() - t0 < 2
            return res

        res = asyncio.run(go())
    assert [p for p, _ in fake.requests] == ["/generate", "/abort_request"]
    assert res.finish_reason == "abort"
    assert res.output_ids == fx["response"]["output_ids"] and len(res.log_probs) == len(res.output_ids)


def test_abort_falls_back_to_local_cancel() -> None:
    fx = load("generate_abort")
    release = threading.Event()

    def handler(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/abort_request":
            return 500, {}
        release.wait(10)  # this server ignores aborts
        return 200, fx["response"]

    with serve(FakeServer(handler)) as fake:
        engine = SGLangEngine(fake.url, abort_timeout_s=0.3, max_retries=0)

        async def go() -> Any:
            task = asyncio.create_task(engine.generate(request_from_fixture(fx)))
            await asyncio.sleep(0.2)
            await engine.abort_all()
            return await task

        res = asyncio.run(go())
        release.set()
    assert res.finish_reason == "abort" and res.output_ids == []


def test_session_routing_header_and_seed() -> None:
    fx = load("generate_length")
    seen: list[dict[str, Any]] = []

    with serve(FakeServer(lambda p, b: (seen.append(b), (200, fx["response"]))[1])) as fake:
        engine = SGLangEngine(fake.url, routing_header="X-SMG-Routing-Key")
        req = request_from_fixture(fx)
        req = GenerationRequest(req.request_id, input_ids=req.input_ids,
                                sampling=SamplingParams(seed=5), session_id="s1")
        asyncio.run(engine.generate(req))
    assert seen[0]["sampling_params"]["sampling_seed"] == 5
    assert fake.headers[0]["x-smg-routing-key"] == "s1"


def test_malformed_answer_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not an SGLang /generate answer"):
        SGLangEngine("http://127.0.0.1:9").parse("r", {"text": "x"})


def test_update_weights_saves_an_hf_folder_and_posts_update_weights_from_disk(tmp_path: Path) -> None:
    """The recorded protocol of SGLang's /update_weights_from_disk (UpdateWeightFromDiskReqInput
    in, {"success", "message"} out), then answers carrying the new weight_version."""
    import torch
    from safetensors.torch import load_file

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "llama"}')
    embed = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    # tied weights share storage, as a model's state dict gives them
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": embed, "model.norm.weight": torch.ones(2)}
    fx = load("generate_stop")
    loaded: list[str] = []

    def handler(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/update_weights_from_disk":
            folder = Path(body["model_path"])
            if not (folder / "model.safetensors").is_file():
                return 400, {"success": False, "message": f"no weights in {folder}"}
            loaded.append(body["weight_version"])
            return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        response = json.loads(json.dumps(fx["response"]))
        response["meta_info"]["weight_version"] = loaded[-1] if loaded else "default"
        return 200, response

    with serve(FakeServer(handler)) as fake:
        engine = SGLangEngine(fake.url, hf_checkpoint=str(base), weight_sync_dir=str(tmp_path / "sync"),
                              keep_weight_versions=2)
        before = asyncio.run(engine.generate(request_from_fixture(fx)))
        assert engine.weight_version == 0 and before.weight_versions == [0] * len(before.output_ids)
        for version in (1, 2, 3):
            engine.update_weights(state, version)
        after = asyncio.run(engine.generate(request_from_fixture(fx)))
    updates = [body for path, body in fake.requests if path == "/update_weights_from_disk"]
    assert [u["weight_version"] for u in updates] == ["1", "2", "3"] == loaded
    assert updates[-1] == {"model_path": str(tmp_path / "sync" / "v3"), "weight_version": "3",
                           "flush_cache": True, "abort_all_requests": False}
    assert engine.weight_version == 3 and after.weight_versions == [3] * len(after.output_ids)
    # an HF folder: safetensors with every name (tied copies included) and the base config
    saved = load_file(str(tmp_path / "sync" / "v3" / "model.safetensors"))
    assert set(saved) == set(state) and all(torch.equal(saved[k], state[k]) for k in state)
    assert (tmp_path / "sync" / "v3" / "config.json").read_text() == '{"model_type": "llama"}'
    # older versions pruned, no temp folders left
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["v2", "v3"]


def test_a_refused_update_is_a_clear_error_and_keeps_the_version(tmp_path: Path) -> None:
    import torch

    def handler(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        return 400, {"success": False, "message": "Failed to load weights: shape mismatch for lm_head.weight"}

    with serve(FakeServer(handler)) as fake:
        engine = SGLangEngine(fake.url, weight_sync_dir=str(tmp_path))
        with pytest.raises(RuntimeError, match="refused .*HTTP 400.*shape mismatch for lm_head.weight"):
            engine.update_weights({"w": torch.zeros(2)}, 1)
        assert engine.weight_version == 0
        with pytest.raises(ValueError, match="version must be an int > the current version 0"):
            engine.update_weights({"w": torch.zeros(2)}, 0)
    unset = SGLangEngine("http://127.0.0.1:9")
    assert "engine.weight_sync_dir" in SGLangEngine.follow_trainer_problem({"weight_sync_dir": None}, False)
    assert SGLangEngine.follow_trainer_problem({"weight_sync_dir": str(tmp_path)}, False) is None
    with pytest.raises(ValueError, match="engine.weight_sync_dir"):
        unset.update_weights({}, 1)
