"""The trainer on the real bundled SmolLM2-135M-Instruct (tiny sizes): policy-gradient steps move
the policy towards the rewarded response, and the hf engine, given the trainer's weights, decodes
greedily exactly as the trained policy does."""

import asyncio
import os

import pytest
import torch

from pipeline.engines.base import GenerationRequest, SamplingParams
from pipeline.engines.hf import HFEngine
from pipeline.train.policy_gradient import PolicyGradientTrainer
from pipeline.train.sync import push_weights
from trainer_fixtures import yaml_keys

pytestmark = pytest.mark.slow


def greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
def test_policy_gradient_steps_on_smollm2_follow_the_reward(bf16):
    from pipeline.engines.assets import load_tokenizer, resolve_checkpoint

    cache = os.environ.get("ROLLOUT_PIPELINE_CACHE")
    folder = resolve_checkpoint("smollm2-135m-instruct", cache)
    tok = load_tokenizer(folder)
    prompt = tok("What is 2 + 3? Answer:")["input_ids"]
    good, bad = tok(" 5")["input_ids"], tok(" 7")["input_ids"]
    data = {"tokens": [prompt + good, prompt + bad], "response_lengths": [len(good), len(bad)],
            "loss_masks": [[1] * len(good), [1] * len(bad)], "rewards": [1.0, -1.0]}
    trainer = PolicyGradientTrainer(**yaml_keys(hf_checkpoint="smollm2-135m-instruct", cache_dir=cache,
                                                num_threads=2, lr=2e-5, micro_batch_size=2, bf16=bf16))
    assert trainer.model.config._attn_implementation == "eager"  # conf/trainer/policy_gradient.yaml
    before = trainer.prepare(data).old_log_probs
    with torch.no_grad():  # (the trainer's own model before training: no second copy to load)
        base_logits = trainer.model(input_ids=torch.tensor([prompt])).logits[0, -1].clone()
    for rollout_id in range(2):
        metrics = trainer.train(rollout_id, data)
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
        assert metrics["train/grad_norm"] > 0
    after = trainer.prepare(data).old_log_probs
    # the rewarded answer became more likely, the penalised one less likely
    assert after[0].sum() > before[0].sum() and after[1].sum() < before[1].sum()
    assert trainer.weight_version == 2

    # the in-process engine, given the trainer's weights, decodes greedily as the trained policy does
    engine = HFEngine(folder, num_threads=2, max_batch_size=2, dtype="float32")
    try:
        sampling = SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=())
        before_sync = asyncio.run(engine.generate(GenerationRequest("a", input_ids=prompt, sampling=sampling)))
        assert push_weights(trainer, engine, None)["perf/weight_sync_time"] >= 0
        after_sync = asyncio.run(engine.generate(GenerationRequest("b", input_ids=prompt, sampling=sampling)))
    finally:
        engine.close()
    assert after_sync.weight_versions == [2] * len(after_sync.output_ids)
    assert after_sync.output_ids == greedy(trainer.model, torch.tensor([prompt]), len(after_sync.output_ids))
    with torch.no_grad():
        trained_logits = trainer.model(input_ids=torch.tensor([prompt])).logits[0, -1]
    assert (trained_logits - base_logits).abs().max() > 1e-3, before_sync.output_ids
