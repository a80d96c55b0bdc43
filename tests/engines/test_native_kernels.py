"""The native decode kernels (pipeline/engines/native_kernels.py) against the PyTorch ops they
replace, their build, and the engine running on them.

Stated tolerances: the residual add, RMSNorm and SiLU-times-up results are PyTorch's bfloat16
results except where a reordered float32 sum lands on the other side of a bfloat16 rounding
boundary (at most 1 in 1,000 elements here, each by at most two bfloat16 steps: one in the
normalised value, which the weight's product can round to two); the attention is at
least as close to a float64 reference as PyTorch's bfloat16 SDPA (measured: 0.0019 against
0.0020 on 32 rows); a whole step on the real model stays as close to the float32 step as
PyTorch's bfloat16 step does (measured max |Δ logit| 0.52 against 0.46 at 32 rows, 0.16
against 0.20 at 1 row); the test allows up to twice PyTorch's difference.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from pipeline.engines import native_kernels
from pipeline.engines.hf_lean import _rotate_half, rms_norm
from tests.engines.conftest import request, run

pytestmark = pytest.mark.skipif(native_kernels.unavailable_reason() is not None,
                                reason=f"native kernels unavailable here: {native_kernels.unavailable_reason()}")

BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> native_kernels.NativeKernels:
    return native_kernels.load(tmp_path_factory.mktemp("native"))


def _bf16_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bfloat16 steps apart each pair of finite values of the same sign is (equal
    values, +0 and -0 included: 0; opposite signs: a large number)."""
    steps = (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()
    return torch.where(a == b, 0, steps)


def _assert_pytorch_rounding(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    steps = _bf16_steps(ours, theirs)
    assert steps.max() <= 2, steps.max()
    assert (steps > 0).float().mean() <= 1e-3, (steps > 0).float().mean()


@pytest.mark.parametrize("rows, hidden", [(1, 576), (7, 64), (8, 576), (33, 1024)])
def test_add_rms_norm_is_the_pytorch_residual_add_and_rms_norm(kernels, rows: int, hidden: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, hidden, generator=gen) * 3).to(BF16)
    delta = torch.randn(rows, hidden, generator=gen).to(BF16)
    weight = torch.randn(hidden, generator=gen).to(BF16)
    summed, h = x.clone(), torch.empty_like(x)
    kernels.add_rms_norm(summed, delta, weight, h, 1e-5)
    assert torch.equal(summed, x + delta)  # one float32 add, rounded: exactly PyTorch's
    _assert_pytorch_rounding(h, rms_norm(x + delta, weight, 1e-5))
    # no delta: x stays as it is, h is its norm
    alone = x.clone()
    kernels.add_rms_norm(alone, None, weight, h, 1e-6)
    assert torch.equal(alone, x)
    _assert_pytorch_rounding(h, rms_norm(x, weight, 1e-6))


@pytest.mark.parametrize("rows, inter", [(1, 1536), (9, 32), (32, 1536)])
def test_silu_mul_is_the_pytorch_silu_times_up(kernels, rows: int, inter: int) -> None:
    gen = torch.Generator().manual_seed(inter)
    gate_up = (torch.randn(rows, 2 * inter, generator=gen) * 4).to(BF16)
    # exp's range ends (e^100 overflows to inf: silu(-100) is -0), signed zeros, NaN
    gate_up[0, :5] = torch.tensor([-100.0, 100.0, 0.0, -0.0, float("nan")])
    out = torch.empty(rows, inter, dtype=BF16)
    kernels.silu_mul(gate_up, out)
    gate, up = gate_up.chunk(2, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    assert out[0, 4].isnan() and expected[0, 4].isnan()
    out[0, 4] = expected[0, 4] = 0
    _assert_pytorch_rounding(out, expected)


def _attention_case(rows: int, heads: int, kv_heads: int, dim: int, column: int, start: int,
                    seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    columns = column + 5
    angles = torch.randn(rows, dim // 2, generator=gen).repeat(1, 2)
    bias = torch.zeros(rows, column + 1 - start, dtype=BF16)
    if rows > 1:
        bias[1, :3] = float("-inf")  # left padding of the second row
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=gen).to(BF16)
    qkv[0] = 0.0  # signed zeros through RoPE's negation and products, as PyTorch rounds them
    return {
        "qkv": qkv,
        "cos": angles.cos().to(BF16), "sin": angles.sin().to(BF16),
        # two spare rows: the kernel must touch only rows 0..rows-1
        "keys": torch.randn(rows + 2, kv_heads, columns, dim, generator=gen).to(BF16),
        "values": torch.randn(rows + 2, kv_heads, columns, dim, generator=gen).to(BF16),
        "bias": bias, "heads": heads, "column": column, "start": start, "scale": dim ** -0.5,
    }


def _reference_attention(case: dict, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`hf_lean.decode_layer`'s RoPE, cache write and SDPA, with the attention in `dtype`."""
    qkv, heads, column, start = case["qkv"], case["heads"], case["column"], case["start"]
    rows, kv_heads, dim = qkv.shape[0], case["keys"].shape[1], case["keys"].shape[3]
    q = qkv[:, : heads * dim].view(rows, kv_heads, heads // kv_heads, dim)
    k = qkv[:, heads * dim: (heads + kv_heads) * dim].view(rows, kv_heads, 1, dim)
    v = qkv[:, (heads + kv_heads) * dim:].view(rows, kv_heads, 1, dim)
    cos, sin = case["cos"].view(rows, 1, 1, dim), case["sin"].view(rows, 1, 1, dim)
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    keys, values = case["keys"].clone(), case["values"].clone()
    keys[:rows, :, column: column + 1], values[:rows, :, column: column + 1] = k, v
    out = torch.nn.functional.scaled_dot_product_attention(
        q.to(dtype), keys[:rows, :, start: column + 1].to(dtype), values[:rows, :, start: column + 1].to(dtype),
        attn_mask=case["bias"].view(rows, 1, 1, -1).to(dtype), scale=case["scale"])
    return out.reshape(rows, heads * dim), keys, values


# SmolLM2's shape (3 query heads per key/value head, head_dim 64) and Llama 3's (4, 128) have
# specialised code paths; (2, 32) and (5, 96) run the generic one; columns cover the softmax's
# 16-wide blocks and their tails, one column alone, and a window that starts after column 0
@pytest.mark.parametrize("heads, kv_heads, dim", [(9, 3, 64), (8, 2, 128), (4, 2, 32), (5, 1, 96)])
@pytest.mark.parametrize("rows, column, start", [(1, 0, 0), (3, 15, 0), (4, 16, 0), (2, 40, 7), (32, 100, 3)])
def test_rope_attention_writes_the_cache_as_pytorch_and_attends_as_exactly(
        kernels, heads: int, kv_heads: int, dim: int, rows: int, column: int, start: int) -> None:
    case = _attention_case(rows, heads, kv_heads, dim, column, start, seed=rows * 100 + column)
    reference, keys, values = _reference_attention(case, BF16)
    exact = _reference_attention(case, torch.float64)[0]
    ours_keys, ours_values = case["keys"].clone(), case["values"].clone()
    out = torch.empty(rows, heads * dim, dtype=BF16)
    kernels.rope_attention(case["qkv"], case["cos"], case["sin"], ours_keys, ours_values, case["bias"], out,
                           heads, column, start, case["scale"])
    # the new key after RoPE and the value: PyTorch's bfloat16 ops bit for bit (signed zeros
    # included); nothing else changes
    assert torch.equal(ours_keys.view(torch.int16), keys.view(torch.int16))
    assert torch.equal(ours_values.view(torch.int16), values.view(torch.int16))
    ours_error = (out.double() - exact).abs().max().item()
    pytorch_error = (reference.double() - exact).abs().max().item()
    # float32 probabilities: as close to float64 as PyTorch's SDPA (which rounds them to
    # bfloat16), up to one bfloat16 step of the output
    assert ours_error <= max(pytorch_error, 2 ** -8 * exact.abs().max().item()), (ours_error, pytorch_error)


def test_masked_columns_get_no_weight(kernels) -> None:
    """A -inf bias removes a column completely: huge values there do not leak into the output."""
    case = _attention_case(2, 9, 3, 64, column=20, start=0, seed=5)
    case["values"][:, :, :3] = 1e30  # the second row's masked columns (bias[1, :3] = -inf)
    case["bias"][0, :3] = float("-inf")
    out = torch.empty(2, 9 * 64, dtype=BF16)
    kernels.rope_attention(case["qkv"], case["cos"], case["sin"], case["keys"], case["values"], case["bias"], out,
                           9, 20, 0, case["scale"])
    assert out.isfinite().all() and out.abs().max() < 10
    exact = _reference_attention(case, torch.float64)[0]
    assert (out.double() - exact).abs().max() <= 2 ** -7 * exact.abs().max()


def test_the_library_is_built_once_into_the_cache_dir_and_rebuilt_when_the_source_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = native_kernels.load(tmp_path)
    built = sorted((tmp_path / "native").iterdir())
    assert built == [first.path]  # no temp file left behind
    assert native_kernels.load(tmp_path) is first  # loaded once per process
    stamp = first.path.stat().st_mtime_ns
    edited = tmp_path / "edited.c"
    edited.write_text(native_kernels.SOURCE.read_text() + "\n/* an edit */\n")
    monkeypatch.setattr(native_kernels, "SOURCE", edited)
    second = native_kernels.load(tmp_path)
    assert second.path != first.path and second.path.exists()
    assert first.path.stat().st_mtime_ns == stamp  # the old build is not touched


def test_a_failing_build_names_the_source_and_the_compiler_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C;\n")
    monkeypatch.setattr(native_kernels, "SOURCE", broken)
    with pytest.raises(RuntimeError, match=r"building .*broken\.c with .* failed"):
        native_kernels.load(tmp_path / "cache")
    assert list((tmp_path / "cache" / "native").iterdir()) == []


def test_a_cache_dir_that_cannot_hold_the_build_is_named(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(RuntimeError, match=f"cannot build the native decode kernels into {not_a_dir}"):
        native_kernels.load(not_a_dir)


def test_no_compiler_is_a_reason_not_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-here")
    assert "no C compiler" in (native_kernels.unavailable_reason() or "")
    with pytest.raises(RuntimeError, match="no C compiler"):
        native_kernels.load(tmp_path)
    if shutil.which("gcc"):
        monkeypatch.setenv("CC", "gcc")
        assert native_kernels.unavailable_reason() is None
        # an installation without the C source (the wheel ships it as package data)
        monkeypatch.setattr(native_kernels, "SOURCE", tmp_path / "gone.c")
        assert "gone.c is missing" in (native_kernels.unavailable_reason() or "")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_native_step_is_as_close_to_float32_as_the_pytorch_bfloat16_step(
        model_path: str, tmp_path: Path) -> None:
    """The real model, a cache filled by 12 float32 steps of random tokens: the next step's logits
    on the native kernels against the float32 step, next to PyTorch's bfloat16 step; after an
    in-place weight update and refresh() the native step follows the new weights."""
    from transformers import AutoModelForCausalLM

    from pipeline.engines.hf_lean import LeanDecoder, packed_matmuls_available
    from pipeline.process.precision import fast_bfloat16

    if not (packed_matmuls_available() and fast_bfloat16()):
        pytest.skip("the native kernels run with packed bfloat16 matmuls, which this CPU does not use")
    model16 = AutoModelForCausalLM.from_pretrained(model_path, dtype=BF16).eval()
    model32 = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    kernels = native_kernels.load(tmp_path)
    native, pytorch, exact = LeanDecoder(model16, packed=True, native=kernels), LeanDecoder(model16, packed=True), \
        LeanDecoder(model32)
    assert native.native is kernels and pytorch.native is None
    assert LeanDecoder(model32, packed=True, native=kernels).native is None  # float32: PyTorch ops
    for rows in (1, 32):
        gen = torch.Generator().manual_seed(rows)
        cache32 = exact.new_cache(rows, 24)
        with torch.inference_mode():
            for column in range(12):
                exact.step(torch.randint(0, 40000, (rows,), generator=gen), torch.full((rows,), column), cache32,
                           column, 0, torch.zeros(rows, 1, 1, column + 1))
            tokens, positions = torch.randint(0, 40000, (rows,), generator=gen), torch.full((rows,), 12)
            bias = torch.zeros(rows, 1, 1, 13, dtype=BF16)
            reference = exact.step(tokens, positions, cache32.clone(), 12, 0, bias.float())
            ours = native.step(tokens, positions, cache32.to(BF16), 12, 0, bias)
            theirs = pytorch.step(tokens, positions, cache32.to(BF16), 12, 0, bias)
        ours_error, pytorch_error = (ours - reference).abs().max(), (theirs - reference).abs().max()
        assert ours_error <= 2 * pytorch_error, (rows, ours_error, pytorch_error)
        assert (ours.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.8
    inputs = (tokens, positions, cache32.to(BF16), 12, 0, bias)
    with torch.inference_mode():
        before = native.step(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
        layer = model16.model.layers[3]
        layer.input_layernorm.weight.mul_(1.5)  # a native kernel's own weight
        layer.mlp.up_proj.weight.mul_(1.5)  # a packed matmul's
        native.refresh()
        after = native.step(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
        rebuilt = LeanDecoder(model16, packed=True, native=kernels).step(
            *[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
    assert (after - before).abs().max() > 1e-2
    assert torch.equal(after, rebuilt)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_engine_runs_on_the_native_kernels_where_it_can_and_says_why_not_elsewhere(
        model_path: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from pipeline.engines.hf import HFEngine
    from pipeline.process.precision import fast_bfloat16

    caplog.set_level(logging.INFO, logger="pipeline.engines.hf")
    exact = HFEngine(model_path, num_threads=2, max_batch_size=4, dtype="float32", cache_dir=str(tmp_path))
    exact.start()
    exact.close()
    assert exact._decoder is not None and exact._decoder.native is None
    assert "native decode kernels not used: they are bfloat16 kernels and the engine runs float32" in caplog.text
    if not fast_bfloat16():
        pytest.skip("bfloat16 is not this CPU's fast precision: the engine does not pick it")
    engine = HFEngine(model_path, num_threads=2, max_batch_size=4, dtype="bfloat16", cache_dir=str(tmp_path))
    try:
        engine.start()
        assert engine._decoder is not None and engine._decoder.native is not None
        assert engine._decoder.native.path.parent == tmp_path / "native"
        assert "native kernels" in caplog.text
        result = run(engine.generate(request(engine.tokenizer, "n", "What is 7 + 5?", temperature=0.0,
                                             max_new_tokens=12)))
    finally:
        engine.close()
    assert len(result.output_ids) > 0 and result.finish_reason in ("stop", "length")
    off = HFEngine(model_path, num_threads=2, max_batch_size=4, dtype="bfloat16", cache_dir=str(tmp_path),
                   native_kernels=False)
    try:
        off.start()
        assert off._decoder is not None and off._decoder.native is None
        plain = run(off.generate(request(off.tokenizer, "p", "What is 7 + 5?", temperature=0.0, max_new_tokens=12)))
    finally:
        off.close()
    # bfloat16 rounding may change a later token; the first ones of a short greedy answer agree
    assert result.output_ids[:4] == plain.output_ids[:4]


def _generators(n: int, skip: int = 0) -> list[torch.Generator]:
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    for g in gens:
        for _ in range(skip):  # as the sampler draws: one float64 per step
            torch.rand(1, generator=g, dtype=torch.float64)
    return gens


def test_the_native_sampler_picks_the_pytorch_samplers_tokens(kernels) -> None:
    """The same generators give the same draws and, over 20 steps of 32 rows (temperatures 1,
    0.7 and greedy; a vocabulary that is not a multiple of the 512-entry blocks), the same
    tokens; the log-probs differ by float32 rounding only."""
    from pipeline.engines.base import SamplingParams
    from pipeline.engines.hf_sampling import sample_batch

    logits = torch.randn(32, 49152 + 77, generator=torch.Generator().manual_seed(0)) * 3
    logits[3, 1000] = logits[3, 2000] = logits[3].max() + 1  # greedy ties: the first one
    params = [SamplingParams(temperature=t) for t in [1.0] * 20 + [0.7] * 6 + [0.0] * 6]
    params[3] = SamplingParams(temperature=0.0)
    for step in range(20):
        theirs, their_lp = sample_batch(logits, params, _generators(32, step))
        ours, our_lp = sample_batch(logits, params, _generators(32, step), kernels=kernels)
        assert torch.equal(ours, theirs), step
        assert max(abs(a - b) for a, b in zip(our_lp, their_lp)) <= 2e-5
    assert ours[3] == 1000
    # a generator is drawn from once per sampled row and step, never for a greedy row
    gens = _generators(32)
    sample_batch(logits, params, gens, kernels=kernels)
    assert [g.initial_seed() for g in gens] == list(range(32))
    reference = _generators(32, skip=1)
    def next_draw(g: torch.Generator) -> float:
        return torch.rand(1, generator=g, dtype=torch.float64).item()

    assert [next_draw(g) == next_draw(r) for g, r in zip(gens, reference)] == [p.temperature > 0 for p in params]


def test_the_native_sampler_draws_from_the_softmax_and_never_a_zero_probability_token(kernels) -> None:
    from pipeline.engines.base import SamplingParams
    from pipeline.engines.hf_sampling import sample_batch

    vocab = 1300  # three blocks, the last one partial
    logits = torch.full((1, vocab), float("-inf"))
    live = torch.tensor([3, 511, 512, 700, 1299])
    logits[0, live] = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5])
    n = 20000
    draws = sample_batch(logits.expand(n, -1).contiguous(), [SamplingParams(temperature=0.8)] * n,
                         _generators(n), kernels=kernels)[0]
    assert set(draws.tolist()) <= set(live.tolist())
    freq = torch.bincount(draws, minlength=vocab)[live].float() / n
    # sampling noise alone gives a total variation of about 0.01 at this n
    assert 0.5 * (freq - torch.softmax(logits[0, live] / 0.8, -1)).abs().sum() < 0.03
    # draws at the ends of [0, 1) land on the first and the last token with any probability
    ends = kernels.sample(logits.expand(2, -1).contiguous(), torch.tensor([1.0, 1.0]),
                          torch.tensor([0.0, 1.0 - 2 ** -53], dtype=torch.float64))[0]
    assert ends.tolist() == [3, 1299]


def test_rows_asking_for_top_k_or_top_p_keep_the_pytorch_sampler(kernels, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.engines.base import SamplingParams
    from pipeline.engines.hf_sampling import sample_batch

    calls: list[int] = []
    real = kernels.sample
    monkeypatch.setattr(kernels, "sample", lambda *a: calls.append(1) or real(*a))
    logits = torch.randn(3, 600, generator=torch.Generator().manual_seed(1))
    for cut in (SamplingParams(top_k=5), SamplingParams(top_p=0.5)):
        params = [SamplingParams(), cut, SamplingParams(temperature=0.0)]
        ours = sample_batch(logits, params, _generators(3), kernels=kernels)
        assert torch.equal(ours[0], sample_batch(logits, params, _generators(3))[0]) and not calls
    sample_batch(logits, [SamplingParams()] * 3, _generators(3), kernels=kernels)
    assert calls == [1]
