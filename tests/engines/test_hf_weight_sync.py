"""hf engine weight sync with the real model: in place, every decode path, versions on tokens."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from pipeline.engines.hf import HFEngine
from tests.engines.conftest import chat_ids, perturbed_state, reference_greedy, request, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

QUESTION = "What is 7 + 5?"
N = 12


def greedy(engine: HFEngine, rid: str, n: int = N) -> Any:
    return run(engine.generate(request(engine.tokenizer, rid, QUESTION, temperature=0.0, max_new_tokens=n,
                                       stop_token_ids=())))


@pytest.mark.parametrize("decode_impl", ["static", "legacy"])
def test_update_weights_changes_greedy_output_in_place_and_back(model_path: str, decode_impl: str) -> None:
    engine = HFEngine(model_path, num_threads=2, max_batch_size=4, decode_impl=decode_impl)
    try:
        before = greedy(engine, "before")
        params = {id(p) for p in engine.model.parameters()}
        state = perturbed_state(model_path)
        engine.update_weights(state, 1)
        assert {id(p) for p in engine.model.parameters()} == params  # no reload: the same tensors
        after = greedy(engine, "after")
        assert after.output_ids != before.output_ids
        ids = chat_ids(engine.tokenizer, QUESTION)
        assert after.output_ids == reference_greedy(model_path, state, ids, len(after.output_ids))
        assert before.weight_versions == [0] * len(before.output_ids)
        assert after.weight_versions == [1] * len(after.output_ids) and engine.weight_version == 1
        # the checkpoint's tensors back (a later version): the original output again
        engine.update_weights({k: v / 0.7 for k, v in state.items()}, 2)
        assert greedy(engine, "restored").output_ids == before.output_ids
    finally:
        engine.close()


def test_bad_updates_change_nothing(model_path: str) -> None:
    engine = HFEngine(model_path, num_threads=2, max_batch_size=4)
    try:
        before = greedy(engine, "before", 6)
        good = perturbed_state(model_path)
        bad_shape = {**good, "model.norm.weight": torch.ones(3)}
        with pytest.raises(ValueError, match=r"model.norm.weight has shape \(3,\), the model's is \(576,\)"):
            engine.update_weights(bad_shape, 1)
        with pytest.raises(ValueError, match="names the model does not have"):
            engine.update_weights({**good, "model.layers.99.mlp.up_proj.weight": torch.ones(1)}, 1)
        with pytest.raises(ValueError, match="version must be an int > the current version 0"):
            engine.update_weights(good, 0)
        assert engine.weight_version == 0
        assert greedy(engine, "same", 6).output_ids == before.output_ids
    finally:
        engine.close()


def test_a_request_in_flight_carries_both_versions(model_path: str) -> None:
    engine = HFEngine(model_path, num_threads=2, max_batch_size=4)
    state = perturbed_state(model_path)
    try:
        engine.start()

        async def go() -> Any:
            task = asyncio.create_task(engine.generate(request(
                engine.tokenizer, "long", "Write a long story about a dragon.", temperature=0.0,
                max_new_tokens=60, stop_token_ids=())))
            while engine.tokens_generated < 5:
                await asyncio.sleep(0.02)
            await asyncio.to_thread(engine.update_weights, state, 1)
            return await task

        res = run(go())
        switch = res.weight_versions.index(1)
        assert 5 <= switch < len(res.output_ids) == 60
        assert res.weight_versions == [0] * switch + [1] * (60 - switch)
    finally:
        engine.close()
