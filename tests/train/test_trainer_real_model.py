"""The trainer on the real bundled SmolLM2-135M-Instruct (tiny sizes): policy-gradient steps move
the policy towards the rewarded response, and a separately loaded model given
`weights_for_engine()` decodes greedily exactly as the trained policy does."""

import os

import pytest
import torch

from pipeline.train.policy_gradient import PolicyGradientTrainer
from trainer_fixtures import yaml_keys

pytestmark = pytest.mark.slow


def greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def test_policy_gradient_steps_on_smollm2_follow_the_reward():
    from transformers import AutoModelForCausalLM

    from pipeline.engines.assets import load_tokenizer, resolve_checkpoint

    cache = os.environ.get("ROLLOUT_PIPELINE_CACHE")
    folder = resolve_checkpoint("smollm2-135m-instruct", cache)
    tok = load_tokenizer(folder)
    prompt = tok("What is 2 + 3? Answer:")["input_ids"]
    good, bad = tok(" 5")["input_ids"], tok(" 7")["input_ids"]
    data = {"tokens": [prompt + good, prompt + bad], "response_lengths": [len(good), len(bad)],
            "loss_masks": [[1] * len(good), [1] * len(bad)], "rewards": [1.0, -1.0]}
    trainer = PolicyGradientTrainer(**yaml_keys(hf_checkpoint="smollm2-135m-instruct", cache_dir=cache,
                                                num_threads=2, lr=2e-5, micro_batch_size=2))
    before = trainer.prepare(data).old_log_probs
    for rollout_id in range(2):
        metrics = trainer.train(rollout_id, data)
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
        assert metrics["train/grad_norm"] > 0
    after = trainer.prepare(data).old_log_probs
    # the rewarded answer became more likely, the penalised one less likely
    assert after[0].sum() > before[0].sum() and after[1].sum() < before[1].sum()
    assert trainer.weight_version == 2

    engine_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    base_output = greedy(engine_model, ids, 6)
    engine_model.load_state_dict(trainer.weights_for_engine())
    assert greedy(engine_model, ids, 6) == greedy(trainer.model, ids, 6)
    with torch.no_grad():
        moved = engine_model(ids).logits[0, -1] - AutoModelForCausalLM.from_pretrained(folder).eval()(ids).logits[0, -1]
    assert moved.abs().max() > 1e-3, base_output
