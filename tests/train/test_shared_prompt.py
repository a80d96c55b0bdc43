"""One forward per distinct prompt gives the per-sample pass's log-probs, entropies and gradients."""

import copy

import pytest
import torch

from pipeline.train.batches import response_log_probs
from pipeline.train.policy_gradient import PolicyGradientTrainer
from pipeline.train.shared_prompt import group_prompts, shared_prompt_log_probs
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


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_entropies_and_gradients_equal_the_per_sample_pass(temperature):
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
