"""A tiny random Llama and train data for the trainer tests; the trainer keys come from the YAML;
a one-rank gloo process group (`group`, a fixture: import it into the test module)."""

import gc
import os
import socket
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

YAML = Path(__file__).resolve().parents[2] / "conf" / "trainer" / "policy_gradient.yaml"


def yaml_keys(**overrides):
    """conf/trainer/policy_gradient.yaml's keys with its interpolations filled for a unit test."""
    keys = OmegaConf.to_container(OmegaConf.load(YAML), resolve=False)
    keys.pop("_target_")
    keys.update(hf_checkpoint=None, cache_dir=None, advantage_estimator="grpo", loss_agg_norm_len=8,
                rollout_temperature=1.0, num_threads=1, seed=0,
                # CPU tests; scripts/gpu_check.sh runs some of them on CUDA
                device=os.environ.get("TRAINER_TEST_DEVICE", "cpu"))
    keys.update(overrides)
    return keys


def tiny_llama(dtype=torch.float64, seed=0, tie_word_embeddings=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tie_word_embeddings)
    model = LlamaForCausalLM(config).to(dtype).eval()
    if dtype == torch.float64:
        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.forward = _rms_norm_in_input_dtype.__get__(module)
    return model


def _rms_norm_in_input_dtype(self, x):
    """LlamaRMSNorm without its float32 round trip, so a float64 model is float64 throughout
    (finite differences see float32 rounding otherwise)."""
    return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


def train_data(with_rollout_log_probs=True):
    """Four samples: prompts of 3-5 tokens, responses of 2-4, one loss-mask zero, mixed rewards."""
    tokens = [[1, 5, 7, 9, 11], [2, 4, 6, 8, 10, 12, 14], [3, 3, 17, 19, 21, 23], [1, 30, 29, 28, 27, 26]]
    lengths = [2, 4, 3, 2]
    data = {
        "tokens": tokens,
        "response_lengths": lengths,
        "loss_masks": [[1, 1], [1, 0, 1, 1], [1, 1, 1], [1, 1]],
        "rewards": [1.0, -1.0, 0.5, -0.5],
    }
    if with_rollout_log_probs:
        data["rollout_log_probs"] = [[-3.3 - 0.1 * j for j in range(n)] for n in lengths]
    return data


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def group():
    """A one-rank gloo process group for the test (torch.distributed's default group). The test's
    sharded and replicated models are collected before the test ends: one left for a later
    garbage collection in a forked child (mutmut runs each mutant in one) would hang it, waiting
    for the group's threads, which a fork does not copy."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()
