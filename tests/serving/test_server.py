"""The SGLang-compatible server on the rollout loop: requests count in the bound rollout's
context, aborts reach requests in flight, an aborted rollout answers abort at once, weight
versions come back per token (pipeline/serving/server.py)."""

from __future__ import annotations

import threading

import httpx
import pytest

from pipeline.engines.scripted import ByteTokenizer, ScriptedEngine
from pipeline.rollout.async_loop import run_sync
from pipeline.rollout.sample_generate import GenContext, active_context, bind, release
from pipeline.serving.server import SGLangServer


class RecordingEngine(ScriptedEngine):
    """The scripted engine, keeping every request it got."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen = []

    async def generate(self, request):
        self.seen.append(request)
        return await super().generate(request)


@pytest.fixture
def served():
    engine = RecordingEngine(token_delay=0.01, max_filler=3)
    server = SGLangServer(lambda: engine)
    server.start()
    previous = active_context()
    ctx = GenContext(engine=engine, tokenizer=engine.tokenizer, rollout_id=5, batch_invariant=True)
    bind(ctx)
    with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as client:
        yield engine, server, ctx, client
    server.close()
    if previous is not None:
        bind(previous)


def _gen(client, **extra):
    body = {"text": "What is 2 + 3?", "sampling_params": {"max_new_tokens": 64, "temperature": 1.0},
            "return_logprob": True, **extra}
    resp = client.post("/generate", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.mark.timeout(60)
def test_requests_count_in_the_bound_rollout_with_its_batch_invariance(served):
    engine, _, ctx, client = served
    out = _gen(client)
    ids = out["output_ids"]
    assert ids and [e[1] for e in out["meta_info"]["output_token_logprobs"]] == ids
    assert out["text"] == ByteTokenizer().decode(ids)
    assert engine.seen[-1].input_ids == list(b"What is 2 + 3?")
    assert engine.seen[-1].sampling.batch_invariant  # the rollout's setting reaches HTTP requests too
    assert (ctx.requests, ctx.http_requests, ctx.tokens_generated) == (1, 1, len(ids))
    second = _gen(client)
    assert ctx.requests == 2 and ctx.tokens_generated == len(ids) + len(second["output_ids"])
    assert client.get("/health").status_code == 200
    assert client.get("/get_model_info").json()["is_generation"] is True
    bad = client.post("/generate", json={"text": "a", "sampling_params": {"n": 3}})
    assert bad.status_code == 400 and "only n=1" in bad.json()["error"]
    assert client.post("/generate", content=b"not json").status_code == 400
    assert ctx.requests == 2  # refused requests count nothing


@pytest.mark.timeout(60)
def test_abort_reaches_requests_in_flight_and_an_aborted_rollout_answers_abort(served):
    engine, _, ctx, client = served
    got = {}
    slow = threading.Thread(target=lambda: got.update(_gen(client, sampling_params={"max_new_tokens": 4000})))
    slow.start()
    while engine.stats.in_flight == 0:
        threading.Event().wait(0.01)
    threading.Event().wait(0.05)
    assert client.post("/abort_request", json={"rid": "", "abort_all": True}).json() == {"success": True}
    slow.join(timeout=20)
    assert got["meta_info"]["finish_reason"]["type"] == "abort"
    assert ctx.tokens_generated == len(got["output_ids"]) > 0  # the partial answer counts
    ctx.aborted = True  # the rollout's batch is full: nothing new reaches the engine
    before = engine.stats.requests
    late = _gen(client)
    assert late["meta_info"]["finish_reason"]["type"] == "abort" and late["output_ids"] == []
    assert engine.stats.requests == before and ctx.requests == 1


@pytest.mark.timeout(60)
def test_weight_versions_come_back_per_token_and_close_stops_serving(served):
    engine, server, _, client = served
    engine.update_weights({}, 3)
    out = _gen(client)
    meta = out["meta_info"]
    assert meta["weight_version"] == "3" and meta["token_weight_versions"] == [3] * len(out["output_ids"])
    assert client.get("/get_weight_version").json() == {"weight_version": "3"}
    url = server.url
    server.close()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=2, trust_env=False)


@pytest.mark.timeout(60)
def test_a_finished_rollout_is_released_so_later_requests_are_not_aborted(served):
    engine, _, ctx, client = served
    ctx.aborted = True  # how a rollout ends
    release(ctx)
    out = _gen(client)
    assert out["meta_info"]["finish_reason"]["type"] != "abort" and out["output_ids"]
    assert ctx.requests == 0 and active_context() is None  # counted nowhere


@pytest.mark.timeout(60)
def test_a_first_start_inside_a_coroutine_on_the_rollout_loop_serves_once_it_awaits():
    engine = ScriptedEngine()
    server = SGLangServer(lambda: engine)

    async def custom_generate_like():
        port = server.start()  # on the loop: bound now, accepting once this coroutine awaits
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            resp = await client.post(f"http://127.0.0.1:{port}/generate",
                                     json={"input_ids": [72, 105], "sampling_params": {"max_new_tokens": 5}})
        return resp.json()

    try:
        out = run_sync(custom_generate_like())
    finally:
        server.close()
    assert len(out["output_ids"]) == 5 and out["meta_info"]["finish_reason"]["type"] == "length"
