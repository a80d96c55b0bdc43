"""The trainer gives tool tokens (loss mask 0) no gradient: no policy-gradient, KL or entropy term.

A response that ends with tool tokens trains exactly as the same response without them (they
follow every model token, so they are context for none): equal gradients in every aggregation
mode, with KL and entropy on. With the mask set to 1 on them the gradient differs (the check can fail)."""

import pytest
import torch

from pipeline.train.policy_gradient import PolicyGradientTrainer
from tests.train.trainer_fixtures import tiny_llama, yaml_keys

torch.set_num_threads(1)
PROMPTS = [[1, 5, 7], [2, 4, 6, 8]]
MODEL = [[9, 11, 13], [10, 12]]
TOOL = [[20, 21, 22, 23], [24, 25]]


def data(with_tool: bool, tool_mask: int = 0) -> dict:
    tokens, lengths, masks, lps = [], [], [], []
    for prompt, model, tool in zip(PROMPTS, MODEL, TOOL):
        response = model + (tool if with_tool else [])
        tokens.append(prompt + response)
        lengths.append(len(response))
        masks.append([1] * len(model) + ([tool_mask] * len(tool) if with_tool else []))
        lps.append([-1.5 - 0.1 * j for j in range(len(model))] + ([0.0] * len(tool) if with_tool else []))
    return {"tokens": tokens, "response_lengths": lengths, "loss_masks": masks, "rewards": [1.0, -0.5],
            "rollout_log_probs": lps, "rollout_ids": [0, 1]}


def gradient(train_data: dict, mode: str) -> torch.Tensor:
    t = PolicyGradientTrainer(model=tiny_llama(), **yaml_keys(loss_agg_mode=mode, use_kl_loss=True, kl_loss_coef=0.2,
                                                             kl_loss_type="k3", entropy_coef=0.05))
    prepared = t.prepare(train_data)
    t.optimizer.zero_grad(set_to_none=True)
    t.accumulate(prepared, [0, 1], backward=True)
    return torch.cat([p.grad.flatten() for p in t.model.parameters() if p.grad is not None])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_tool_tokens_get_no_gradient(mode):
    without = gradient(data(with_tool=False), mode)
    masked = gradient(data(with_tool=True), mode)
    assert without.abs().sum() > 0
    assert torch.allclose(masked, without, rtol=1e-9, atol=1e-12)
    trained_on = gradient(data(with_tool=True, tool_mask=1), mode)
    assert not torch.allclose(trained_on, without, rtol=1e-3, atol=1e-6)
