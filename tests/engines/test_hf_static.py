"""The hf engine's static decode path against the legacy path and float32, and its sampler.

Stated tolerances (bfloat16 vs float32 on the bundled model, measured on the eval prompts:
|Δ log-prob| of float32's greedy tokens mean 0.019, p95 0.07, max 0.15; next-token total
variation mean 0.013, max 0.065): the tests allow mean |Δ| <= 0.05, max <= 0.5, and a total
variation distance <= 0.15 between the token frequencies of 4,000 seeded draws per prompt
(same seeds for both precisions; measured up to 0.104 over the first 8 eval prompts).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pipeline.engines import hf_static
from pipeline.engines.base import GenerationRequest, SamplingParams
from pipeline.engines.hf import HFEngine
from pipeline.engines.hf_sampling import sample_batch
from tests.engines.conftest import chat_ids, request, run

EVAL = Path(__file__).resolve().parents[2] / "data" / "math_eval.jsonl"


def _draws(logits: torch.Tensor, n: int, **sampling: float) -> torch.Tensor:
    """`n` seeded samples from one row of logits (a batch of n identical rows, seeds 0..n-1)."""
    chunk = 256  # a [n, vocab] float64 CDF at n=4000 is 1.5 GB: sample in slices of rows
    out = []
    for lo in range(0, n, chunk):
        m = min(chunk, n - lo)
        params = [SamplingParams(**sampling)] * m
        gens = [torch.Generator().manual_seed(i) for i in range(lo, lo + m)]
        out.append(sample_batch(logits.expand(m, -1).contiguous(), params, gens)[0])
    return torch.cat(out)


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def test_batched_sampler_draws_from_the_softmax_distribution() -> None:
    logits = torch.randn(1, 10, generator=torch.Generator().manual_seed(0)) * 1.5
    n = 20000
    freq = torch.bincount(_draws(logits, n, temperature=0.7), minlength=10).float() / n
    # sampling noise alone gives a total variation of about 0.01 at this n
    assert _tv(freq, torch.softmax(logits[0] / 0.7, -1)) < 0.03


def test_batched_sampler_top_k_and_top_p_renormalise_the_kept_tokens() -> None:
    logits = torch.tensor([[3.0, 2.5, 2.0, 1.0, 0.5, 0.0, -1.0, -2.0]])
    probs = torch.softmax(logits[0], -1)
    n = 20000
    top3 = torch.bincount(_draws(logits, n, top_k=3), minlength=8).float() / n
    expected = torch.where(torch.arange(8) < 3, probs, torch.zeros_like(probs))
    assert top3[3:].sum() == 0 and _tv(top3, expected / expected.sum()) < 0.03
    # nucleus 0.6: keep tokens whose mass above them is < 0.6
    before = probs.cumsum(0) - probs
    nucleus = torch.where(before < 0.6, probs, torch.zeros_like(probs))
    top_p = torch.bincount(_draws(logits, n, top_p=0.6), minlength=8).float() / n
    assert top_p[nucleus == 0].sum() == 0 and _tv(top_p, nucleus / nucleus.sum()) < 0.03


def test_batched_sampler_seeded_row_is_the_same_alone_and_in_a_batch() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.9, top_p=0.8), SamplingParams(temperature=1.2, top_k=5)]
    batch, batch_lp = sample_batch(logits, params, [torch.Generator().manual_seed(s) for s in range(4)])
    for i in range(4):
        alone, alone_lp = sample_batch(logits[i:i + 1], params[i:i + 1], [torch.Generator().manual_seed(i)])
        assert int(alone[0]) == int(batch[i]) and alone_lp[0] == pytest.approx(batch_lp[i])
    assert int(batch[1]) == int(logits[1].argmax())
    assert batch_lp[1] == pytest.approx(float(torch.log_softmax(logits[1], -1)[batch[1]]))


@pytest.mark.parametrize("vocab", [49152, 1000, 513, 7])
def test_two_level_inverse_cdf_matches_one_full_cumulative_sum(vocab: int) -> None:
    """The block-then-entry search picks what one float64 cumulative sum over the whole row
    picks, including rows with zeros (top-k / top-p cuts), vocabularies that are not a multiple
    of the block, and draws at both ends of [0, 1); it never returns a zero-probability index."""
    from pipeline.engines.hf_sampling import _inverse_cdf

    gen = torch.Generator().manual_seed(vocab)
    probs = torch.rand(300, vocab, generator=gen) ** 8
    probs[probs < 0.3] = 0.0
    probs[:, 0] += 1e-3
    probs[:, -1] = 0.0  # the last entry has no mass: the end-of-range draw must not land on it
    probs[5] = 0.0
    probs[5, vocab // 2] = 1.0  # one token of all the mass
    draws = torch.rand(300, generator=gen, dtype=torch.float64)
    draws[0], draws[1] = 0.0, 1.0 - 2.0 ** -53
    cdf = probs.double().cumsum(-1)
    expected = torch.searchsorted(cdf, (draws * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    picked = _inverse_cdf(probs, draws)
    assert (probs.gather(1, picked.unsqueeze(1)) > 0).all()
    assert picked[5] == vocab // 2
    # the full sum can only differ by float64 rounding at a boundary; none in 300 rows here
    assert torch.equal(picked, expected)


def test_unknown_decode_impl_or_dtype_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="engine.decode_impl must be one of"):
        HFEngine("smollm2-135m-instruct", decode_impl="fast")
    with pytest.raises(ValueError, match="engine.dtype must be one of"):
        HFEngine("smollm2-135m-instruct", dtype="int8")
    # the switches take booleans only: "maybe" (a truthy string) would silently mean true
    for key in ("compile_decode", "packed_matmuls", "native_kernels"):
        with pytest.raises(ValueError, match=f"engine.{key} must be true or false, got 'maybe'"):
            HFEngine("smollm2-135m-instruct", **{key: "maybe"})


@pytest.fixture(scope="module")
def legacy_engine(model_path: str) -> Iterator[HFEngine]:
    engine = HFEngine(model_path, num_threads=2, max_batch_size=64, decode_impl="legacy")
    engine.start()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def bf16_engine(model_path: str) -> Iterator[HFEngine]:
    engine = HFEngine(model_path, num_threads=2, max_batch_size=8, dtype="bfloat16")
    engine.start()
    yield engine
    engine.close()


def _eval_prompts(tok: object, n: int | None = None) -> list[list[int]]:
    rows = [json.loads(line) for line in EVAL.read_text().splitlines() if line.strip()]
    return [chat_ids(tok, r["input"]) for r in rows[:n]]


async def _greedy_all(engine: HFEngine, prompts: list[list[int]], tokens: int) -> list:
    return await asyncio.gather(*(engine.generate(GenerationRequest(
        f"e{i}", input_ids=p, sampling=SamplingParams(temperature=0.0, max_new_tokens=tokens)))
        for i, p in enumerate(prompts)))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_static_float32_greedy_equals_legacy_on_the_eval_prompts(model_path: str,
                                                                  legacy_engine: HFEngine) -> None:
    static = HFEngine(model_path, num_threads=2, max_batch_size=64, decode_impl="static")
    try:
        static.start()
        assert static._decoder is not None  # the static path really runs
        prompts = _eval_prompts(static.tokenizer)
        assert len(prompts) == 60
        new = run(_greedy_all(static, prompts, 24))
        old = run(_greedy_all(legacy_engine, prompts, 24))
    finally:
        static.close()
    assert [r.output_ids for r in new] == [r.output_ids for r in old]
    for a, b in zip(new, old):
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rows_joining_with_longer_prompts_and_cache_growth_match_each_alone(
        hf_engine: HFEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Late rows with longer prompts shift the running rows; a tiny growth step makes the
    buffer grow and reclaim columns many times; every row still decodes as it does alone."""
    monkeypatch.setattr(hf_static, "_MIN_COLUMNS", 4)
    tok = hf_engine.tokenizer
    questions = ["Hi.", "Write a long sentence about the sea, the ships and the harbour at night.",
                 "Name three colours and a fruit."]
    kw = dict(temperature=0.0, max_new_tokens=20)

    async def staggered() -> list:
        tasks = []
        for i, q in enumerate(questions):
            tasks.append(asyncio.create_task(hf_engine.generate(request(tok, f"s{i}", q, **kw))))
            await asyncio.sleep(0.4)
        return await asyncio.gather(*tasks)

    together = run(staggered())
    for i, q in enumerate(questions):
        alone = run(hf_engine.generate(request(tok, f"a{i}", q, **kw)))
        assert together[i].output_ids == alone.output_ids
        assert torch.allclose(torch.tensor(together[i].log_probs), torch.tensor(alone.log_probs), atol=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bfloat16_log_probs_and_sampling_stay_close_to_float32(hf_engine: HFEngine,
                                                              bf16_engine: HFEngine) -> None:
    tok = hf_engine.tokenizer
    prompts = _eval_prompts(tok, 8)
    reference = run(_greedy_all(hf_engine, prompts, 16))  # float32
    diffs: list[float] = []
    with torch.inference_mode():
        for prompt, ref in zip(prompts, reference):
            ids = torch.tensor([prompt + ref.output_ids])
            logits = bf16_engine.model(input_ids=ids).logits[0].float()
            start = len(prompt) - 1
            lp = torch.log_softmax(logits[start:start + len(ref.output_ids)], -1)
            lp = lp.gather(1, torch.tensor(ref.output_ids)[:, None]).squeeze(1)
            diffs += (lp - torch.tensor(ref.log_probs)).abs().tolist()
            # the next-token distribution after the prompt: seeded draws from both precisions
            first32 = hf_engine.model(input_ids=ids[:, :len(prompt)]).logits[:, -1].float()
            first16 = logits[start:start + 1]
            n = 4000
            f32 = torch.bincount(_draws(first32, n), minlength=first32.shape[1]).float() / n
            f16 = torch.bincount(_draws(first16, n), minlength=first32.shape[1]).float() / n
            assert _tv(f32, f16) <= 0.15
    assert sum(diffs) / len(diffs) <= 0.05 and max(diffs) <= 0.5
    # the bf16 engine's own log-probs are those of its (bf16) model
    res = run(bf16_engine.generate(request(tok, "b", temperature=1.0, max_new_tokens=8, seed=4)))
    ids = torch.tensor([chat_ids(tok, "What is 7 + 5?") + res.output_ids])
    with torch.inference_mode():
        logits = bf16_engine.model(input_ids=ids).logits[0].float()
    start = ids.shape[1] - len(res.output_ids) - 1
    expected = torch.log_softmax(logits[start:start + len(res.output_ids)], -1)
    expected = expected.gather(1, torch.tensor(res.output_ids)[:, None]).squeeze(1)
    assert (torch.tensor(res.log_probs) - expected).abs().mean() <= 0.05


def _step_inputs(decoder: object, rows: int, column: int) -> tuple:
    """A deterministic synthetic decode-step input: a filled cache, tokens, positions, bias."""
    gen = torch.Generator().manual_seed(rows)
    cache = decoder.new_cache(rows, column + 8)
    cache.copy_(torch.randn(cache.shape, generator=gen) * 0.5)
    tokens = torch.randint(0, 40000, (rows,), generator=gen)
    positions = torch.full((rows,), column)
    bias = torch.zeros(rows, 1, 1, column + 1, dtype=decoder.dtype)
    bias[0, ..., :3] = float("-inf")  # the first row starts later (left padding)
    return tokens, positions, cache, column, 0, bias


def _perturb_in_place(model: object) -> None:
    """Change weights of every kind in place, as a trainer's weight sync does."""
    layer = model.model.layers[3]
    with torch.no_grad():
        for w in (layer.self_attn.k_proj.weight, layer.mlp.up_proj.weight, layer.self_attn.o_proj.weight):
            w.mul_(1.5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_refresh_picks_up_in_place_weight_updates(model_path: str) -> None:
    """Fused q/k/v and gate/up tensors are copies: refresh() updates them in place (same
    tensors), after which the step equals a decoder built from the updated model."""
    from transformers import AutoModelForCausalLM

    from pipeline.engines.hf_lean import LeanDecoder

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    decoder = LeanDecoder(model)
    fused = decoder.layers[3]["qkv"]
    with torch.inference_mode():
        before = decoder.step(*_step_inputs(decoder, 3, 12))
        _perturb_in_place(model)
        decoder.refresh()
        after = decoder.step(*_step_inputs(decoder, 3, 12))
        rebuilt = LeanDecoder(model).step(*_step_inputs(decoder, 3, 12))
    assert decoder.layers[3]["qkv"] is fused
    assert (after - before).abs().max() > 1e-2
    assert torch.equal(after, rebuilt)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_compiled_decode_matches_eager_and_sees_in_place_weight_updates(model_path: str) -> None:
    """engine.compile_decode: the compiled per-layer step gives the eager step's logits (float32,
    reordered sums only), at several batch sizes and cache widths without a recompile per
    shape, and reads the weights as inputs: an in-place update + refresh() changes its output
    exactly as it changes the eager step's."""
    from transformers import AutoModelForCausalLM

    from pipeline.engines.hf_lean import LeanDecoder

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    eager, compiled = LeanDecoder(model), LeanDecoder(model, compile=True)
    assert compiled.compiled and not eager.compiled
    shapes = [(3, 12), (5, 30), (2, 17)]
    with torch.inference_mode():
        for rows, column in shapes:
            a, b = eager.step(*_step_inputs(eager, rows, column)), compiled.step(*_step_inputs(eager, rows, column))
            # logits of up to ~20 after 30 layers: reordered float32 sums differ by up to 2.2e-3
            # (AVX2 kernels; under 2e-3 on AVX-512)
            assert torch.allclose(a, b, atol=5e-3, rtol=0), (rows, column, (a - b).abs().max())
            assert torch.equal(a.argmax(-1), b.argmax(-1))
        before = compiled.step(*_step_inputs(eager, 3, 12))
        _perturb_in_place(model)
        eager.refresh()
        compiled.refresh()
        a, b = eager.step(*_step_inputs(eager, 3, 12)), compiled.step(*_step_inputs(eager, 3, 12))
    assert (b - before).abs().max() > 1e-2  # the compiled step saw the new weights
    assert torch.allclose(a, b, atol=2e-3, rtol=0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_packed_matmuls_match_aten_and_follow_in_place_weight_updates(model_path: str) -> None:
    """engine.packed_matmuls (the default): the step with oneDNN-blocked weights gives the
    aten::linear step's logits (float32, reordered sums only) and the same greedy tokens, and
    refresh() re-packs: an in-place update changes its output as it changes the aten step's."""
    from transformers import AutoModelForCausalLM

    from pipeline.engines.hf_lean import LeanDecoder, packed_matmuls_available

    if not packed_matmuls_available():
        pytest.skip("this torch build has no oneDNN pre-packed linear")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    aten, packed = LeanDecoder(model), LeanDecoder(model, packed=True)
    assert packed.packed and not aten.packed
    assert not LeanDecoder(model, compile=True, packed=True).packed  # compiled steps keep aten
    with torch.inference_mode():
        for rows, column in [(1, 9), (3, 12), (5, 30), (16, 20)]:
            a, b = aten.step(*_step_inputs(aten, rows, column)), packed.step(*_step_inputs(aten, rows, column))
            # reordered float32 sums through 30 layers of this synthetic random cache: measured up
            # to 0.026 on logits up to ~21 at 16 rows (AVX2), so 2e-3 of the largest logit; on real
            # prompts the engine's greedy tokens and log-probs agree (test_static_float32_greedy_...)
            assert (a - b).abs().max() <= 2e-3 * a.abs().max(), (rows, column, (a - b).abs().max())
            assert torch.equal(a.argmax(-1), b.argmax(-1))
        before = packed.step(*_step_inputs(aten, 3, 12))
        _perturb_in_place(model)
        aten.refresh()
        packed.refresh()
        a, b = aten.step(*_step_inputs(aten, 3, 12)), packed.step(*_step_inputs(aten, 3, 12))
        rebuilt = LeanDecoder(model, packed=True).step(*_step_inputs(aten, 3, 12))
    assert (b - before).abs().max() > 1e-2  # the packed step saw the new weights
    assert torch.equal(b, rebuilt)
    assert (a - b).abs().max() <= 2e-3 * a.abs().max()
    # the blocked weights replace the fused copies, from the start (never both at once)
    assert all(w["qkv"] is None and w["gate_up"] is None for w in packed.layers)
    assert len(packed._packed_layers) == len(packed.layers)  # a refresh replaces, never appends


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_packed_bfloat16_where_the_cpu_has_bfloat16_kernels(model_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 steps pack their weights only where oneDNN has bfloat16 kernels (elsewhere its
    bfloat16 reorder and matmul are a slow reference path), and there the packed step's logits
    are bit-identical to the aten::linear step's (the same oneDNN kernel, without the re-pack)."""
    from transformers import AutoModelForCausalLM

    from pipeline.engines import hf_lean
    from pipeline.engines.hf_lean import LeanDecoder, packed_matmuls_available

    if not packed_matmuls_available():
        pytest.skip("this torch build has no oneDNN pre-packed linear")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).eval()
    with monkeypatch.context() as m:
        m.setattr(hf_lean, "fast_bfloat16", lambda: False)
        assert not LeanDecoder(model, packed=True).packed
    if not hf_lean.fast_bfloat16():
        pytest.skip("no bfloat16 kernels on this CPU: the packed bfloat16 step is not used here")
    aten, packed = LeanDecoder(model), LeanDecoder(model, packed=True)
    assert packed.packed and not aten.packed
    with torch.inference_mode():
        for rows, column in [(1, 9), (3, 12), (16, 20), (33, 7)]:
            a, b = aten.step(*_step_inputs(aten, rows, column)), packed.step(*_step_inputs(aten, rows, column))
            assert torch.equal(a, b), (rows, column, (a - b).abs().max())


def test_distinct_prompts_keep_first_seen_order() -> None:
    rows = [hf_static.Row(str(i), p, SamplingParams(), 4, torch.Generator(), frozenset(), lambda r: None)
            for i, p in enumerate([[1, 2], [3], [1, 2], [1, 2, 3], [3]])]
    distinct, source = hf_static.distinct_prompts(rows)
    assert [r.request_id for r in distinct] == ["0", "1", "3"]
    assert source == [0, 1, 0, 2, 1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_group_sharing_one_prefill_samples_as_each_row_alone(model_path: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """4 seeded samples of one prompt and one of another join together: one prefill row per
    prompt, and every row's tokens and log-probs are those it gets alone (float32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.engines.hf_lean import LeanDecoder

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_path)
    prefilled: list[int] = []
    real_prefill = hf_static.prefill

    def counting_prefill(model, rows, pad_id, cache_kw):  # type: ignore[no-untyped-def]
        prefilled.append(len(rows))
        return real_prefill(model, rows, pad_id, cache_kw)

    monkeypatch.setattr(hf_static, "prefill", counting_prefill)
    prompts = [chat_ids(tok, "What is 7 + 5?")] * 4 + [chat_ids(tok, "Name a colour.")]

    def rows() -> list:
        return [hf_static.Row(str(i), p, SamplingParams(temperature=1.0), 10, torch.Generator().manual_seed(i),
                              frozenset(), lambda r: None) for i, p in enumerate(prompts)]

    def generate(batch_rows: list) -> list:
        batch = hf_static.StaticDecodeBatch(model, tok, tok.pad_token_id, LeanDecoder(model))
        with torch.inference_mode():
            batch.admit(batch_rows)
            batch.release_finished()
            while len(batch):
                batch.decode()
                batch.release_finished()
        return batch_rows

    together = generate(rows())
    assert prefilled == [2]
    alone = [generate([row])[0] for row in rows()]
    assert len({tuple(r.output_ids) for r in together[:4]}) > 1  # the group's samples differ
    for a, b in zip(together, alone):
        assert a.output_ids == b.output_ids
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-4)
