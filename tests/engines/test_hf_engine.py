"""The in-process hf engine against the real bundled model (short generations)."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from pipeline.engines.base import Engine, GenerationRequest, SamplingParams
from pipeline.engines.hf import HFEngine
from tests.engines.conftest import chat_ids, request, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_construction_is_lazy() -> None:
    engine = HFEngine("smollm2-135m-instruct")
    assert engine.model is None and isinstance(engine, Engine)
    engine.close()


def test_log_probs_match_a_full_forward_at_temperature(hf_engine: HFEngine) -> None:
    tok = hf_engine.tokenizer
    req = request(tok, "lp", temperature=0.7, max_new_tokens=8, seed=3)
    res = run(hf_engine.generate(req))
    assert len(res.log_probs) == len(res.output_ids) > 0
    ids = torch.tensor([list(req.input_ids) + res.output_ids])
    with torch.inference_mode():
        logits = hf_engine.model(input_ids=ids).logits[0].float()
    start = len(req.input_ids) - 1
    expected = torch.log_softmax(logits[start:start + len(res.output_ids)] / 0.7, -1)
    expected = expected.gather(1, torch.tensor(res.output_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(res.log_probs), expected, atol=2e-3)
    assert res.text == tok.decode(res.output_ids, skip_special_tokens=True)


def test_seed_reproducible_alone_and_in_a_batch(hf_engine: HFEngine) -> None:
    tok = hf_engine.tokenizer

    async def go() -> list:
        alone = await hf_engine.generate(request(tok, "a", max_new_tokens=10, seed=11))
        batch = await asyncio.gather(
            hf_engine.generate(request(tok, "b", max_new_tokens=10, seed=11)),
            hf_engine.generate(request(tok, "c", "Name a colour.", max_new_tokens=10, seed=12)),
            hf_engine.generate(request(tok, "d", max_new_tokens=10, seed=99)),
        )
        return [alone, *batch]

    alone, same, other, different_seed = run(go())
    assert alone.output_ids == same.output_ids
    assert [r.request_id for r in (alone, same, other)] == ["a", "b", "c"]
    assert different_seed.output_ids != alone.output_ids


def test_batch_invariant_log_probs_are_the_same_bits_alone_and_in_any_batch(hf_engine: HFEngine) -> None:
    tok = hf_engine.tokenizer
    kw = dict(temperature=0.8, max_new_tokens=10, seed=21)

    async def go(invariant: bool) -> list:
        alone = await hf_engine.generate(request(tok, "a", **kw, batch_invariant=invariant))
        # a different batch: a longer prompt (left padding) and other rows around it
        batch = await asyncio.gather(
            hf_engine.generate(request(tok, "x", "Write a long sentence about the sea and ships.", max_new_tokens=6,
                                       seed=1)),
            hf_engine.generate(request(tok, "b", **kw, batch_invariant=invariant)),
            hf_engine.generate(request(tok, "y", "Name a colour.", max_new_tokens=14, seed=2)),
        )
        return [alone, batch[1]]

    alone, batched = run(go(True))
    assert alone.output_ids == batched.output_ids and alone.finish_reason in ("stop", "length")
    assert alone.log_probs == batched.log_probs  # exact float equality, not a tolerance
    plain_alone, plain_batched = run(go(False))
    assert plain_alone.output_ids == alone.output_ids
    # the recomputed values are the same distribution's log-probs (a full forward at temperature)
    assert torch.allclose(torch.tensor(plain_batched.log_probs), torch.tensor(alone.log_probs), atol=2e-3)


def test_top_k_one_is_greedy_and_length_finish(hf_engine: HFEngine) -> None:
    tok = hf_engine.tokenizer
    greedy = run(hf_engine.generate(request(tok, "g", temperature=0.0, max_new_tokens=6)))
    top1 = run(hf_engine.generate(request(tok, "k", temperature=1.0, top_k=1, max_new_tokens=6, seed=5)))
    assert greedy.output_ids == top1.output_ids
    assert greedy.finish_reason == "length" and len(greedy.output_ids) == 6


def test_stop_strings_and_stop_ids(hf_engine: HFEngine) -> None:
    tok = hf_engine.tokenizer
    full = run(hf_engine.generate(request(tok, "f", temperature=0.0, max_new_tokens=12)))
    assert len(full.output_ids) >= 4
    stop_id = full.output_ids[2]
    by_id = run(hf_engine.generate(request(tok, "i", temperature=0.0, max_new_tokens=12,
                                           stop_token_ids=(stop_id,))))
    assert by_id.finish_reason == "stop"
    assert by_id.output_ids == full.output_ids[:full.output_ids.index(stop_id) + 1]
    word = tok.decode(full.output_ids[3:4]).strip()
    by_text = run(hf_engine.generate(request(tok, "s", temperature=0.0, max_new_tokens=12,
                                             stop=(word,))))
    assert by_text.finish_reason == "stop" and word in by_text.text
    assert len(by_text.output_ids) <= 4


def test_text_prompt(hf_engine: HFEngine) -> None:
    req = GenerationRequest("t", text="The capital of France is",
                            sampling=SamplingParams(temperature=0.0, max_new_tokens=3))
    res = run(hf_engine.generate(req))
    assert len(res.output_ids) == 3 and res.text


def test_late_request_joins_the_running_batch(hf_engine: HFEngine) -> None:
    tok = hf_engine.tokenizer

    async def go() -> tuple[float, float]:
        long = asyncio.create_task(hf_engine.generate(
            request(tok, "long", temperature=0.0, max_new_tokens=40, stop_token_ids=())))
        await asyncio.sleep(0.5)
        short = await hf_engine.generate(request(tok, "short", temperature=0.0, max_new_tokens=3))
        t_short = time.perf_counter()
        long_res = await long
        assert short.finish_reason in ("length", "stop") and long_res.output_ids
        return t_short, time.perf_counter()

    t_short, t_long = run(go())
    assert t_short < t_long  # the short request did not wait for the long one to finish


def test_abort_returns_partial_tokens_then_continuation_matches(hf_engine: HFEngine) -> None:
    tok = hf_engine.tokenizer
    prompt = "Write a long story about a dragon."
    budget = 30
    full = run(hf_engine.generate(request(tok, "full", prompt, temperature=0.0,
                                          max_new_tokens=budget)))

    async def interrupted() -> list:
        tasks = [asyncio.create_task(hf_engine.generate(
            request(tok, f"r{i}", prompt, temperature=0.0, max_new_tokens=budget)))
            for i in range(3)]
        await asyncio.sleep(1.0)
        t0 = time.perf_counter()
        await hf_engine.abort_all()
        results = await asyncio.gather(*tasks)
        assert time.perf_counter() - t0 < 2.0  # promptly
        return results

    parts = run(interrupted())
    for part in parts:
        assert part.finish_reason == "abort"
        assert 0 < len(part.output_ids) < budget
        assert len(part.log_probs) == len(part.output_ids)
        assert part.output_ids == full.output_ids[:len(part.output_ids)]
    # continue the first one from its tokens with the reduced budget (partial rollout)
    part = parts[0]
    cont_req = GenerationRequest(
        "cont", input_ids=chat_ids(tok, prompt) + part.output_ids,
        sampling=SamplingParams(temperature=0.0, max_new_tokens=budget - len(part.output_ids)))
    cont = run(hf_engine.generate(cont_req))
    assert part.output_ids + cont.output_ids == full.output_ids
    # the engine still serves requests after an abort
    after = run(hf_engine.generate(request(tok, "after", temperature=0.0, max_new_tokens=2)))
    assert after.finish_reason == "length"


def test_close_is_idempotent_and_refuses_new_work(model_path: str) -> None:
    engine = HFEngine(model_path, num_threads=2)
    engine.start()
    engine.close()
    engine.close()
    assert not run(engine.health())
    with pytest.raises(RuntimeError, match="closed"):
        run(engine.generate(GenerationRequest("x", input_ids=[1, 2, 3])))
