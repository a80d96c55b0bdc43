"""One forward per distinct prompt gives the per-sample pass's log-probs, entropies and gradients."""

import copy

import pytest
import torch

from pipeline.train.batches import response_log_probs
from pipeline.train.policy_gradient import PolicyGradientTrainer
import pipeline.train.shared_prompt as shared_prompt
from pipeline.train.shared_prompt import group_prompts, length_chunks, shared_prompt_log_probs
from trainer_fixtures import tiny_llama, yaml_keys

torch.set_num_threads(1)


def grouped_samples(seed=1):
    """Groups of samples sharing a prompt, interleaved, with prompts of different lengths, one
    prompt a prefix of another, and responses of 1..4 tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 32, (n,), generator=g) for n in (5, 3, 7)]
    prompts.append(torch.cat([prompts[1], torch.tensor([9])]))  # a longer prompt starting like prompt 1
    plan = [(0, 2), (1, 3), (0, 4), (2, 1), (1, 3), (3, 2), (0, 1), (3, 4)]
    tokens = [torch.cat([prompts[p], torch.randint(0, 32, (n,), generator=g)]) for p, n in plan]
    return tokens, [n for _, n in plan]


def test_group_prompts_keeps_first_seen_order():
    tokens, lengths = grouped_samples()
    prompts, group = group_prompts(tokens, lengths)
    assert group == [0, 1, 0, 2, 1, 3, 0, 3]
    assert [len(p) for p in prompts] == [5, 3, 7, 4]
    assert all(torch.equal(tokens[i][: len(tokens[i]) - lengths[i]], prompts[group[i]]) for i in range(len(tokens)))


def padded_cost(chunks, lengths, overhead):
    return sum(len(c) * max(lengths[i] for i in c) + overhead for c in chunks)


@pytest.mark.parametrize("seed", range(6))
def test_length_chunks_cover_every_sample_once_at_the_least_padded_cost(seed):
    import itertools
    import random

    rng = random.Random(seed)
    lengths = [rng.choice([1, 2, 3, 8, 16, 48]) for _ in range(rng.randint(1, 7))]
    overhead = rng.choice([0, 5, 32])
    chunks = length_chunks(lengths, overhead)
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    # the best split of the length-sorted order, by brute force over every set of cut points
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = min(padded_cost([order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)))], lengths, overhead)
               for k in range(len(order)) for cuts in itertools.combinations(range(1, len(order)), k))
    assert padded_cost(chunks, lengths, overhead) == best


def test_length_chunks_split_by_length_only_where_padding_costs_more_than_a_pass():
    lengths = [48, 2, 3, 48, 2, 47]
    assert length_chunks(lengths, 10 ** 6) == [[1, 4, 2, 5, 0, 3]]  # one pass: sorted, stable
    assert length_chunks(lengths, 32) == [[1, 4, 2], [5, 0, 3]]
    assert length_chunks(lengths, 0) == [[1, 4], [2], [5], [0, 3]]
    assert length_chunks([], 32) == []


@pytest.mark.parametrize("overhead", [10 ** 6, 0])  # one response pass; a pass per response length
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_entropies_and_gradients_equal_the_per_sample_pass(temperature, overhead, monkeypatch):
    monkeypatch.setattr(shared_prompt, "PASS_OVERHEAD_TOKENS", overhead)
    model = tiny_llama()
    tokens, lengths = grouped_samples()
    weights = [torch.randn(n, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
               for i, n in enumerate(lengths)]
    results = []
    for fn in (response_log_probs, shared_prompt_log_probs):
        model.zero_grad(set_to_none=True)
        log_probs, entropies = fn(model, tokens, lengths, temperature, True)
        assert [lp.shape[0] for lp in log_probs] == lengths and [e.shape[0] for e in entropies] == lengths
        sum((lp * w).sum() + 0.1 * e.sum() for lp, w, e in zip(log_probs, weights, entropies)).backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((torch.cat(log_probs), torch.cat(entropies), grad))
    (lp_a, ent_a, grad_a), (lp_b, ent_b, grad_b) = results
    assert torch.allclose(lp_a, lp_b, rtol=0, atol=1e-12)
    assert torch.allclose(ent_a, ent_b, rtol=0, atol=1e-12)
    assert grad_a.abs().max() > 0.1  # every layer gets a real gradient
    assert torch.allclose(grad_a, grad_b, rtol=1e-10, atol=1e-12)


def test_lora_model_and_no_grad_agree():
    from pipeline.train.model import wrap_lora

    model = wrap_lora(tiny_llama(), 4, 8, 0.0, "all-linear")
    with torch.no_grad():  # non-zero adapters, so they change the output
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    tokens, lengths = grouped_samples(seed=2)
    with torch.no_grad():
        per_sample, _ = response_log_probs(model, tokens, lengths, 1.0, False)
        shared, none = shared_prompt_log_probs(model, tokens, lengths, 1.0, False)
    assert none is None
    assert torch.allclose(torch.cat(per_sample), torch.cat(shared), rtol=0, atol=1e-12)


def test_group_prompts_refuses_lists_of_different_lengths():
    tokens, lengths = grouped_samples()
    with pytest.raises(ValueError):
        group_prompts(tokens, lengths[:-1])


def test_autocast_runs_every_pass_in_the_asked_precision():
    """float32 weights under float16 / bfloat16 autocast: every linear layer of the shared pass
    and of the per-sample pass computes in the asked precision, the two passes agree (exactly
    in float32; within the precision's rounding otherwise, as kernels of other shapes round
    differently: up to 2.7e-4 in bfloat16 on an AVX2 CPU), and each precision really changes
    the result."""
    model = tiny_llama(torch.float32)
    seen: list[torch.dtype] = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    tokens, lengths = grouped_samples()
    results = {}
    with torch.no_grad():
        for dtype in (None, torch.float16, torch.bfloat16):
            seen.clear()
            per_sample = torch.cat(response_log_probs(model, tokens, lengths, 1.0, False, dtype)[0])
            assert seen and set(seen) == {dtype or torch.float32}, (dtype, set(seen))
            seen.clear()
            shared = torch.cat(shared_prompt_log_probs(model, tokens, lengths, 1.0, False, dtype)[0])
            assert seen and set(seen) == {dtype or torch.float32}, (dtype, set(seen))
            assert torch.allclose(shared, per_sample, rtol=0, atol=1e-6 if dtype is None else 2e-3), dtype
            results[dtype] = shared
    assert (results[torch.float16] - results[None]).abs().max() > 1e-5
    assert (results[torch.float16] - results[torch.bfloat16]).abs().max() > 1e-4


def test_entropy_without_a_gradient_when_the_loss_has_no_entropy_term():
    model = tiny_llama()
    tokens, lengths = grouped_samples()
    for fn in (response_log_probs, shared_prompt_log_probs):
        log_probs, with_grad = fn(model, tokens, lengths, 1.0, True)
        _, without = fn(model, tokens, lengths, 1.0, True, entropy_grad=False)
        assert all(lp.requires_grad for lp in log_probs) and all(e.requires_grad for e in with_grad)
        assert not any(e.requires_grad for e in without)
        assert torch.equal(torch.cat(with_grad).detach(), torch.cat(without))


def test_a_training_step_lands_on_the_same_weights():
    tokens, lengths = grouped_samples()
    data = {"tokens": [t.tolist() for t in tokens], "response_lengths": lengths,
            "loss_masks": [[1] * (n - 1) + [0] if n > 2 else [1] * n for n in lengths],
            "rewards": [1.0, -1.0, 0.5, 0.0, -0.5, 1.0, -1.0, 0.25]}
    model = tiny_llama()
    trained = []
    for shared in (True, False):
        t = PolicyGradientTrainer(model=copy.deepcopy(model), **yaml_keys(share_prompt_forward=shared, lr=0.01,
                                                                           micro_batch_size=3, global_batch_size=4))
        metrics = [t.train(r, data) for r in range(2)]
        trained.append((torch.cat([p.detach().flatten() for p in t.model.parameters()]), metrics))
    (weights_a, metrics_a), (weights_b, metrics_b) = trained
    assert (weights_a - torch.cat([p.flatten() for p in model.parameters()])).abs().max() > 1e-3  # it trained
    assert torch.allclose(weights_a, weights_b, rtol=0, atol=1e-12)
    for a, b in zip(metrics_a, metrics_b):
        assert {k: v for k, v in a.items() if not k.startswith("perf/")} == pytest.approx(
            {k: v for k, v in b.items() if not k.startswith("perf/")}, rel=1e-9, abs=1e-12)
