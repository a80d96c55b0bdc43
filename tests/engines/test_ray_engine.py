"""The ray engine: 2 hf replicas as actors, least-loaded dispatch, failover, abort fan-out."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any
from collections.abc import Iterator

import pytest

from pipeline.engines.base import GenerationRequest, SamplingParams
from pipeline.engines.ray_pool import RayEngine, request_from_dict, request_to_dict
from tests.engines.conftest import request

ray = pytest.importorskip("ray")


def test_requests_cross_as_plain_dicts() -> None:
    req = GenerationRequest("r", input_ids=[1, 2], sampling=SamplingParams(
        temperature=0.5, stop=("\n",), stop_token_ids=(7,), seed=3), session_id="s")
    d = request_to_dict(req)
    assert d["sampling"]["stop"] == ["\n"] and isinstance(d["sampling"], dict)
    assert request_from_dict(d) == req


def test_bad_replica_count_is_refused() -> None:
    with pytest.raises(ValueError, match="num_replicas"):
        RayEngine("smollm2-135m-instruct", num_replicas=0)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def pool(model_path: str, loop: asyncio.AbstractEventLoop) -> Iterator[RayEngine]:
    engine = RayEngine(model_path, num_replicas=2, num_cpus=2, threads_per_replica=1,
                       max_batch_size=8)
    # Ray's processes start without OMP_WAIT_POLICY, so replicas get it only from runtime_env
    saved = os.environ.pop("OMP_WAIT_POLICY", None)
    try:
        loop.run_until_complete(asyncio.wait_for(engine.start(), 120))
    finally:
        if saved is not None:
            os.environ["OMP_WAIT_POLICY"] = saved
    yield engine
    engine.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_killed_replica_loses_nothing_and_is_restarted(
    pool: RayEngine, hf_engine, loop: asyncio.AbstractEventLoop
) -> None:
    tok = hf_engine.tokenizer
    prompt = "Write a long story about a dragon."
    budget = 40
    expected = loop.run_until_complete(
        hf_engine.generate(request(tok, "ref", prompt, temperature=0.0, max_new_tokens=budget)))
    victim = pool.replicas()[0]

    async def go() -> list:
        tasks = [asyncio.create_task(pool.generate(
            request(tok, f"r{i}", prompt, temperature=0.0, max_new_tokens=budget)))
            for i in range(6)]
        await asyncio.sleep(1.0)  # both replicas are mid-generation
        assert pool._slots[0].inflight > 0 and pool._slots[1].inflight > 0
        assert not any(t.done() for t in tasks)
        ray.kill(victim)
        return await asyncio.gather(*tasks)

    results = loop.run_until_complete(asyncio.wait_for(go(), 120))
    assert sorted(r.request_id for r in results) == [f"r{i}" for i in range(6)]
    for r in results:
        assert r.finish_reason == expected.finish_reason
        assert r.output_ids == expected.output_ids
        assert len(r.log_probs) == len(r.output_ids)
    # the slot got a fresh actor that becomes ready and serves requests
    assert pool.replicas()[0] is not victim

    async def wait_ready() -> None:
        while not pool._slots[0].ready:
            await asyncio.sleep(0.1)

    loop.run_until_complete(asyncio.wait_for(wait_ready(), 60))
    assert loop.run_until_complete(pool.health())
    stats = loop.run_until_complete(pool.stats())
    assert len(stats) == 2


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_abort_fans_out_to_every_replica(pool: RayEngine, hf_engine,
                                         loop: asyncio.AbstractEventLoop) -> None:
    tok = hf_engine.tokenizer

    async def go() -> tuple[list, float]:
        tasks = [asyncio.create_task(pool.generate(
            request(tok, f"a{i}", "Write a long poem.", temperature=1.0, max_new_tokens=200,
                    seed=i))) for i in range(4)]
        await asyncio.sleep(1.5)
        t0 = time.perf_counter()
        await pool.abort_all()
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - t0

    results, took = loop.run_until_complete(asyncio.wait_for(go(), 60))
    assert took < 3.0
    assert {r.finish_reason for r in results} == {"abort"}
    assert all(len(r.output_ids) < 200 and len(r.log_probs) == len(r.output_ids) for r in results)
    assert {pool_i for pool_i, s in enumerate(pool._slots) if s.inflight == 0} == {0, 1}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_abort_reaches_requests_in_transit_and_spares_later_ones(
        pool: RayEngine, hf_engine, loop: asyncio.AbstractEventLoop) -> None:
    tok = hf_engine.tokenizer

    def long_req(rid: str, seed: int) -> GenerationRequest:
        return request(tok, rid, "Write a long poem.", temperature=1.0, max_new_tokens=200, seed=seed)

    async def go() -> tuple[list, list, float, object]:
        running = [asyncio.create_task(pool.generate(long_req(f"b{i}", i))) for i in range(4)]
        await asyncio.sleep(1.5)  # these are decoding on both replicas
        stale_epoch = pool._abort_epoch
        # these are dispatched (sent to a replica) in the same tick as the abort: they reach the
        # replicas around the time the abort does, in either order
        racing = [asyncio.create_task(pool.generate(long_req(f"c{i}", 10 + i))) for i in range(4)]
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        await pool.abort_all()
        # requests stamped before the abort that arrive after it (delayed in transit)
        late = [actor.generate.remote(request_to_dict(long_req(f"d{i}", 20 + i)), stale_epoch)
                for i, actor in enumerate(pool.replicas())]
        results = await asyncio.gather(*running, *racing)
        late_out = await asyncio.gather(*late)
        took = time.perf_counter() - t0
        after = await pool.generate(request(tok, "e", temperature=0.0, max_new_tokens=4))
        return results, late_out, took, after

    results, late_out, took, after = loop.run_until_complete(asyncio.wait_for(go(), 90))
    assert took < 5.0, f"abort took {took:.1f}s"
    assert {r.finish_reason for r in results} == {"abort"}
    assert all(len(r.output_ids) < 200 and len(r.log_probs) == len(r.output_ids) for r in results)
    assert any(r.output_ids for r in results[:4])  # the running ones kept their partial output
    assert [d["finish_reason"] for d in late_out] == ["abort", "abort"]
    assert all(d["output_ids"] == [] for d in late_out)
    # the abort does not poison requests submitted after it
    assert after.finish_reason in ("stop", "length") and len(after.output_ids) >= 1
    assert all(s.inflight == 0 for s in pool._slots)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_replicas_get_passive_openmp_waits(pool: RayEngine, loop: asyncio.AbstractEventLoop) -> None:
    # a nested function travels by value (a module-level one would be imported by module name)
    def probe(_replica):
        return __import__("os").environ.get("OMP_WAIT_POLICY")

    async def go() -> list:
        return await asyncio.gather(*(a.__ray_call__.remote(probe) for a in pool.replicas()))

    assert loop.run_until_complete(asyncio.wait_for(go(), 30)) == ["PASSIVE", "PASSIVE"]


def test_replica_env_defaults_to_passive_and_keeps_driver_value(monkeypatch) -> None:
    from pipeline.engines.ray_pool import replica_env

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert replica_env() == {"OMP_WAIT_POLICY": "PASSIVE"}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert replica_env() == {"OMP_WAIT_POLICY": "ACTIVE"}
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")  # omp_spin_count of the run (pipeline/process/openmp.py)
    assert replica_env() == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "10000"}


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_abort_reaches_requests_queued_on_the_driver(pool: RayEngine, hf_engine,
                                                     loop: asyncio.AbstractEventLoop) -> None:
    tok = hf_engine.tokenizer

    async def go() -> object:
        saved = [s.ready for s in pool._slots]
        for s in pool._slots:  # every replica (re)starting: the request waits on the driver
            s.ready = False
        try:
            task = asyncio.create_task(pool.generate(
                request(tok, "q", "Write a long poem.", temperature=1.0, max_new_tokens=200, seed=1)))
            await asyncio.sleep(0.3)
            assert not task.done()
            await pool.abort_all()
        finally:
            for s, ready in zip(pool._slots, saved):
                s.ready = ready
        return await asyncio.wait_for(task, 3.0)

    result = loop.run_until_complete(asyncio.wait_for(go(), 30))
    assert result.finish_reason == "abort" and result.output_ids == []


# -- weight sync (mutates the pool's weights: keep these tests last in the module) --------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_weight_update_reaches_both_replicas_and_a_restarted_one(
    pool: RayEngine, model_path: str, loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.engines.hf import HFEngine
    from tests.engines.conftest import perturbed_state

    state = perturbed_state(model_path)
    reference = HFEngine(model_path, num_threads=1, max_batch_size=2)
    try:
        reference.update_weights(state, 1)
        tok = reference.tokenizer
        req = request(tok, "g", "What is 7 + 5?", temperature=0.0, max_new_tokens=10)
        expected = loop.run_until_complete(reference.generate(req))
        original = loop.run_until_complete(pool.generate(req))
        assert original.output_ids != expected.output_ids and original.weight_versions == [0] * 10
    finally:
        reference.close()

    puts: list[Any] = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(value) or real_put(value, **kw))
    pool.update_weights(state, 1)
    assert len(puts) == 1 and pool.weight_version == 1  # one object in the store for every replica

    def on_each_replica() -> list[dict]:
        return ray.get([actor.generate.remote(request_to_dict(req), pool._abort_epoch)
                        for actor in pool.replicas()])

    for out in on_each_replica():
        assert out["output_ids"] == expected.output_ids and out["weight_versions"] == [1] * 10
    assert ray.get([a.weight_version.remote() for a in pool.replicas()]) == [1, 1]

    # a replica killed after the update comes back serving version 1
    victim = pool.replicas()[1]
    ray.kill(victim)

    async def until_replaced() -> list:
        outs: list = []
        while pool.replicas()[1] is victim:  # concurrent requests reach both slots (least-loaded)
            outs += await asyncio.gather(*(pool.generate(request(
                tok, f"k{len(outs) + i}", "What is 7 + 5?", temperature=0.0, max_new_tokens=10)) for i in range(2)))
        while not all(s.ready for s in pool._slots):
            await asyncio.sleep(0.1)
        return outs

    outs = loop.run_until_complete(asyncio.wait_for(until_replaced(), 150))
    assert outs and all(o.output_ids == expected.output_ids and o.weight_versions == [1] * 10 for o in outs)
    assert ray.get([a.weight_version.remote() for a in pool.replicas()]) == [1, 1]
    for out in on_each_replica():
        assert out["output_ids"] == expected.output_ids and out["weight_versions"] == [1] * 10
    # a state the model rejects changes nothing on any replica
    with pytest.raises(ValueError, match="names the model does not have"):
        pool.update_weights({"model.layers.99.mlp.up_proj.weight": state[next(iter(state))]}, 2)
    assert pool.weight_version == 1
    assert ray.get([a.weight_version.remote() for a in pool.replicas()]) == [1, 1]
