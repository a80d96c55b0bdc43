"""A sharded (DCP) trainer state in one process, no process group: written and read back by the
one-process trainer, and refused, naming the folder, by a trainer of another LoRA setting."""

import json

import pytest
import torch

from pipeline.train.distributed import shards
from pipeline.train.policy_gradient import PolicyGradientTrainer
from trainer_fixtures import tiny_llama, train_data, yaml_keys


def trainer(folder, **overrides):
    return PolicyGradientTrainer(**yaml_keys(hf_checkpoint=str(folder), lr=1e-3, **overrides))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    tiny_llama(torch.float32).save_pretrained(folder)
    return folder


def test_a_sharded_state_round_trips_and_a_lora_state_is_refused_by_a_full_model(checkpoint, tmp_path):
    lora = trainer(checkpoint, lora_rank=4)
    lora.train(0, train_data())
    state = tmp_path / "state"
    shards.save_shards(lora.model, lora.optimizer, state)
    (state / "trainer_state.json").write_text(json.dumps({"format_version": 1, "layout": "dcp", "weight_version": 1,
                                                          "optimizer_step": 1, "rng": []}))
    assert shards.is_sharded_state(state) and not shards.is_sharded_state(tmp_path)
    again = trainer(checkpoint, lora_rank=4)
    again.load(str(state))
    assert again.weight_version == 1
    a, b = lora.weights_for_engine(), again.weights_for_engine()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match=r"state: the saved trainer state does not match the model \(Missing key"
                                         r".*\); another model or LoRA setting \(trainer.lora_rank\)\?"):
        trainer(checkpoint).load(str(state))
