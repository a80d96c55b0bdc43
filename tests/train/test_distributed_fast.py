"""The distributed trainer's parts without Ray, in this process (fast enough to run per mutant).

- `strategy.py` and `shards.py` on a one-rank gloo process group (`group`: FSDP2 and DDP both
  work with one worker): a one-rank FSDP2 / DDP trainer makes the one-process trainer's update,
  its gathered weights are the one-process ones (LoRA merged as peft merges), its checkpoints
  load both ways. Where a collective's answer only differs with a second worker (sums, maxima,
  the metrics of all workers) a stand-in for the collective plays the second worker
  (`peer_all_reduce`, `peer_all_gather`).
- `worker.py`: `TrainerWorker` as a plain object in that group (`where()` asks Ray: covered by
  tests/train/test_distributed_trainer.py).
- `driver.py` and `group.py`: `DistributedTrainer` with a stand-in `WorkerGroup` (`InProcessGroup`:
  real workers called in this process; `CannedGroup`: canned results), and `WorkerGroup`'s
  calls, failures and shutdown with stand-ins for Ray's `wait`, `get` and `kill`
  (placing the workers needs a Ray cluster: the end-to-end tests).
The trainer's loop as one worker of N (padding micro-batches, the sharded resume) is in
tests/train/test_policy_gradient_parallel.py. The end-to-end tests with two workers on Ray
(tests/train/test_distributed_trainer.py, test_distributed_nodes.py,
tests/resume/test_resume_kill_worker.py) are `slow`.
"""

from __future__ import annotations

import copy
import datetime
import json
import logging
import os
import random
import re
import resource
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from pipeline.config.args import SlimeArgs
from pipeline.process import malloc as malloc_module
from pipeline.train import model as policy_model
from pipeline.train.distributed import driver as driver_module
from pipeline.train.distributed import group as group_module
from pipeline.train.distributed import shards, strategy
from pipeline.train.distributed import worker as worker_module
from pipeline.train.distributed.driver import SHARDED_LAYOUT, DistributedTrainer
from pipeline.train.distributed.group import TrainerWorkerError, WorkerGroup, worker_env
from pipeline.train.distributed.strategy import TorchParallel, wrap_classes
from pipeline.train.distributed.worker import TrainerWorker
from pipeline.train.parallel import LocalParallel
from pipeline.train.policy_gradient import PolicyGradientTrainer
from pipeline.train.state import FORMAT_VERSION, read_state, rng_state, seed_rngs
from trainer_fixtures import free_port, group, tiny_llama, train_data, yaml_keys  # noqa: F401 (group: a fixture)

torch.set_num_threads(1)

pytestmark = pytest.mark.timeout(60)


def exactly(message: str) -> str:
    """A pytest.raises pattern of the whole message (re.search would accept any text around it)."""
    return f"^{re.escape(message)}$"


CPU = torch.device("cpu")
# metrics both trainers report (perf/* are times)
COMPARED = ("train/loss", "train/pg_loss", "train/entropy", "train/kl_loss", "train/grad_norm", "train/lr")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny")
    tiny_llama(torch.float32).save_pretrained(folder)
    return str(folder)


def keys(**overrides):
    return yaml_keys(**{"lr": 1e-2, "micro_batch_size": 2, "entropy_coef": 0.01, **overrides})


def built(t: PolicyGradientTrainer) -> PolicyGradientTrainer:
    """`t` with its model (LoRA-wrapped, sharded) and optimizer made now, right after the
    trainer seeded the random streams: LoRA's initial A matrices are drawn from them."""
    _ = t.optimizer
    return t


def plain(base, **overrides) -> PolicyGradientTrainer:
    return built(PolicyGradientTrainer(model=copy.deepcopy(base), **keys(**overrides)))


def one_rank(base, strategy_name, parallel_options=None, **overrides) -> PolicyGradientTrainer:
    parallel = TorchParallel(strategy_name, CPU, **(parallel_options or {}))
    return built(PolicyGradientTrainer(model=copy.deepcopy(base), parallel=parallel, **keys(**overrides)))


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((torch.as_tensor(a[k]).double() - torch.as_tensor(b[k]).double()).abs().max()) for k in a)


def snapshot(model, lora: bool) -> dict:
    """The gathered weights as copies (on one CPU rank `full_weights` may hand out the parameters
    themselves, which later steps change)."""
    return {k: v.clone() for k, v in shards.full_weights(model, lora).items()}


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def peer_all_reduce(monkeypatch, peer: list):
    """torch.distributed.all_reduce as a two-worker group's, the other worker holding `peer`."""
    seen = []

    def all_reduce(t, op=dist.ReduceOp.SUM):
        seen.append(t.dtype)
        other = torch.tensor(peer, dtype=t.dtype)
        if op == dist.ReduceOp.SUM:
            t += other
        elif op == dist.ReduceOp.MAX:
            torch.maximum(t, other, out=t)
        else:
            raise AssertionError(f"unexpected op {op}")

    monkeypatch.setattr(strategy.dist, "all_reduce", all_reduce)
    return seen


def peer_all_gather(monkeypatch, parallel, peer: dict):
    """all_gather_object as a two-worker group's: this worker is rank 0, the other sent `peer`."""
    def all_gather_object(parts, obj):
        assert len(parts) == 2
        parts[0], parts[1] = obj, peer

    parallel.world_size = 2
    monkeypatch.setattr(strategy.dist, "all_gather_object", all_gather_object)


# -- parallel.py: the one-process answers -----------------------------------------------------


def test_one_process_answers_are_its_own():
    p = LocalParallel()
    assert (p.rank, p.world_size, p.grad_scale) == (0, 1, 1.0) and type(p.grad_scale) is float
    model = torch.nn.Linear(2, 2)
    assert p.wrap(model) is model and p.reshard(model) is None
    assert p.total([1, 2.5]) == [1.0, 2.5] and all(type(x) is float for x in p.total([1, 2]))
    assert p.most([3.0, 2]) == [3, 2] and all(type(x) is int for x in p.most([3.0, 2]))
    metrics = {"loss": 1.0}
    assert p.combine(metrics) == metrics and p.combine(metrics) is not metrics
    assert p.train_forward(model, lambda m, x, scale=1.0: (m, x, scale), 5, scale=2.0) == (model, 5, 2.0)
    with p.micro_batch_sync(last=False):
        pass
    model.weight.grad = torch.full((2, 2), 3.0)
    model.bias.grad = torch.zeros(2)
    norm = p.clip_grad_norm(list(model.parameters()), 1.0)
    assert type(norm) is float and norm == pytest.approx(6.0)
    assert float(torch.linalg.vector_norm(model.weight.grad)) == pytest.approx(1.0, rel=1e-5)


# -- strategy.py: which modules FSDP2 shards ----------------------------------------------------


def test_fsdp2_shards_the_models_no_split_modules_unless_told_otherwise():
    model = tiny_llama(torch.float32)
    assert wrap_classes(model, None) == ["LlamaDecoderLayer"] == wrap_classes(model, [])
    asked = ["LlamaDecoderLayer"]
    names = wrap_classes(model, asked)
    assert names == asked and names is not asked
    lora = policy_model.wrap_lora(tiny_llama(torch.float32), 2, 4, 0.0, "all-linear")
    assert wrap_classes(lora, None) == ["LlamaDecoderLayer"]  # read from the HF model inside peft


def test_a_model_without_layer_classes_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=exactly(
            "trainer.strategy=fsdp2: Sequential names no layer class to shard (no _no_split_modules); set "
            "trainer.fsdp_wrap_modules=[<its decoder layer class>] or use trainer.strategy=ddp")):
        wrap_classes(torch.nn.Sequential(torch.nn.Linear(2, 2)), None)


def test_a_layer_class_the_model_lacks_is_refused_naming_its_layer_classes():
    with pytest.raises(ValueError, match=exactly(
            "trainer.strategy=fsdp2: LlamaForCausalLM has no module of class ['NoSuchLayer'] to shard (its classes "
            "include ['LlamaDecoderLayer']); set trainer.fsdp_wrap_modules to one of them, or use "
            "trainer.strategy=ddp")):
        wrap_classes(tiny_llama(torch.float32), ["NoSuchLayer"])
    # one name of two missing: the missing one is named
    lora = policy_model.wrap_lora(tiny_llama(torch.float32), 2, 4, 0.0, "all-linear")
    with pytest.raises(ValueError, match=re.escape("LlamaForCausalLM has no module of class ['NoSuchLayer'] ")):
        wrap_classes(lora, ["LlamaDecoderLayer", "NoSuchLayer"])
    # at most 8 layer or block classes are listed, sorted
    layers = [type(f"Layer{i}", (torch.nn.Linear,), {})(1, 1) for i in range(10)]
    model = torch.nn.Sequential(*layers, type("ABlock", (torch.nn.ReLU,), {})(), torch.nn.Tanh())
    with pytest.raises(ValueError) as err:
        wrap_classes(model, ["NoSuchLayer"])
    assert f"(its classes include {['ABlock'] + [f'Layer{i}' for i in range(7)]})" in str(err.value)


@pytest.mark.parametrize("kwargs,message", [
    ({"strategy": "zero3"}, "trainer.strategy must be one of ['fsdp2', 'ddp'], got 'zero3'"),
    ({"strategy": "fsdp2", "param_dtype": "float16"},
     "trainer.param_dtype must be one of ['float32', 'bfloat16'], got 'float16'"),
    ({"strategy": "fsdp2", "gloo_collectives": "ring"},
     "trainer.gloo_collectives must be one of ['broadcast', 'native'], got 'ring'"),
    ({"strategy": "ddp", "param_dtype": "bfloat16"},
     "trainer.param_dtype=bfloat16 needs trainer.strategy=fsdp2 (FSDP2's mixed precision); with ddp use "
     "trainer.bf16=true (autocast)"),
])
def test_bad_strategy_settings_are_refused_naming_the_key(kwargs, message):
    with pytest.raises(ValueError, match=exactly(message)):
        TorchParallel(device=CPU, **kwargs)


def test_nccl_collectives_run_on_the_current_gpu(group, monkeypatch):
    monkeypatch.setattr(strategy.dist, "get_backend", lambda: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert TorchParallel("ddp", CPU)._comm_device == torch.device("cuda", 3)


class StopCollective(Exception):
    pass


def test_the_collectives_tensors_live_on_the_backends_device(group, monkeypatch):
    # NCCL moves tensors from the GPU: the collective must get them there (the meta device stands
    # in for a GPU this machine lacks)
    p = TorchParallel("ddp", CPU)
    p._comm_device = torch.device("meta")
    seen = []

    def all_reduce(t, op=None):
        seen.append((t.device, t.dtype))
        raise StopCollective

    monkeypatch.setattr(strategy.dist, "all_reduce", all_reduce)
    for call in (p.total, p.most):
        with pytest.raises(StopCollective):
            call([1])
    assert seen == [(torch.device("meta"), torch.float64), (torch.device("meta"), torch.int64)]


def test_the_group_gives_rank_world_size_and_cpu_collectives(group):
    p = TorchParallel("ddp", CPU, ["X"], 0, "float32")
    assert (p.rank, p.world_size, p.grad_scale) == (0, 1, 1.0)
    assert (p.strategy, p.device, p.wrap_modules, p.param_dtype) == ("ddp", CPU, ["X"], "float32")
    assert p.reshard_after_forward is False
    assert TorchParallel("fsdp2", CPU).reshard_after_forward is True
    assert p._comm_device == CPU


# -- strategy.py: the collectives -----------------------------------------------------------


def test_total_sums_every_workers_numbers_in_float64(group, monkeypatch):
    p = TorchParallel("ddp", CPU)
    assert p.total([0.1, 3.0]) == [0.1, 3.0]  # one worker: its own, exactly
    seen = peer_all_reduce(monkeypatch, [0.2, 2**40 + 0.5])
    out = p.total([0.1, 3.0])
    assert out == [0.1 + 0.2, 2**40 + 3.5] and all(type(x) is float for x in out)
    assert seen == [torch.float64]


def test_most_takes_the_largest_entry_of_any_worker(group, monkeypatch):
    p = TorchParallel("ddp", CPU)
    assert p.most([3, 2**40]) == [3, 2**40]
    peer_all_reduce(monkeypatch, [5, 1])
    out = p.most([3, 2**40])
    assert out == [5, 2**40] and all(type(x) is int for x in out)


def test_combine_sums_the_workers_shares_and_keeps_the_global_grad_norm(group, monkeypatch):
    p = TorchParallel("ddp", CPU)
    assert p.combine({"loss": 1.5, "grad_norm": 2.0}) == {"loss": 1.5, "grad_norm": 2.0}
    peer_all_gather(monkeypatch, p, {"loss": 0.25, "grad_norm": 2.0, "tis": 1.0})
    out = p.combine({"loss": 1.5, "grad_norm": 2.0, "kl": 0.5})
    assert out == {"loss": 1.75, "grad_norm": 2.0, "kl": 0.5, "tis": 1.0}
    assert all(type(v) is float for v in out.values())
    # a worker without a grad_norm of its own (no step) sums what the others sent
    assert p.combine({"loss": 1.0}) == {"loss": 1.25, "grad_norm": 2.0, "tis": 1.0}


class PartialNorm:
    """What FSDP2's clip_grad_norm_ returns on one of two workers: a DTensor whose local value is
    this worker's part and whose full tensor is the norm over every shard."""

    def __float__(self):
        return 2.5

    def full_tensor(self):
        return torch.tensor(5.0)


def test_a_sharded_gradient_norm_is_the_whole_models(group, monkeypatch):
    p = TorchParallel("fsdp2", CPU)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, max_norm: PartialNorm())
    norm = p.clip_grad_norm([], 1.0)
    assert norm == 5.0 and type(norm) is float
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, max_norm: torch.tensor(1.5))
    assert p.clip_grad_norm([], 1.0) == 1.5  # a plain tensor (DDP): its value


def test_rank_zero_grad_norm_is_the_one_reported(group, monkeypatch):
    p = TorchParallel("ddp", CPU)
    peer_all_gather(monkeypatch, p, {"grad_norm": 7.0})
    assert p.combine({"grad_norm": 3.0}) == {"grad_norm": 3.0}


@pytest.mark.parametrize("name", ["fsdp2", "ddp"])
def test_clip_grad_norm_is_the_whole_models_norm_and_clips(group, name):
    base = tiny_llama(torch.float32)
    ids = torch.tensor([[1, 2, 3, 4]])
    reference = copy.deepcopy(base)
    reference(input_ids=ids).logits.square().sum().backward()
    expected = float(torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 0.5))
    model = copy.deepcopy(base)
    p = TorchParallel(name, CPU)
    p.wrap(model)
    p.train_forward(model, lambda m, x: m(input_ids=x).logits.square().sum(), ids).backward()
    params = list(model.parameters())
    norm = p.clip_grad_norm(params, 0.5)
    assert type(norm) is float and norm == pytest.approx(expected, rel=1e-5) and norm > 1.0
    after = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(local(q.grad)) for q in params]))
    assert float(after) == pytest.approx(0.5, rel=1e-4)


# -- strategy.py: wrapping ------------------------------------------------------------------


def test_fsdp2_shards_each_layer_and_the_hf_model_as_root(group):
    from torch.distributed.fsdp import FSDPModule

    model = tiny_llama(torch.float32)
    p = TorchParallel("fsdp2", CPU)
    assert p.wrap(model) is model
    assert isinstance(model, FSDPModule) and all(isinstance(layer, FSDPModule) for layer in model.model.layers)
    assert not isinstance(model.model, FSDPModule) and not isinstance(model.model.norm, FSDPModule)
    assert all(type(q).__name__ == "DTensor" for q in model.parameters())
    assert p.mesh.device_type == "cpu" and p.mesh is p.mesh and p._ddp is None
    lora = policy_model.wrap_lora(tiny_llama(torch.float32), 2, 4, 0.0, "all-linear")
    TorchParallel("fsdp2", CPU).wrap(lora)
    assert isinstance(lora.get_base_model(), FSDPModule) and not isinstance(lora, FSDPModule)


def test_fsdp2_shards_the_classes_asked_for_and_calls_the_model_directly(group):
    from torch.distributed.fsdp import FSDPModule

    model = tiny_llama(torch.float32)
    p = TorchParallel("fsdp2", CPU, ["LlamaMLP"])
    p.wrap(model)
    assert all(isinstance(layer.mlp, FSDPModule) and not isinstance(layer, FSDPModule)
               for layer in model.model.layers)
    ids = torch.tensor([[1, 2]])
    out = p.train_forward(model, lambda m, x, scale=1.0: (m(input_ids=x).logits.sum(), scale), ids, scale=0.5)
    with torch.no_grad():
        expected = float(model(input_ids=ids).logits.sum())
    assert float(out[0]) == pytest.approx(expected) and out[1] == 0.5  # keywords passed on


def test_fsdp2_keeps_gathered_parameters_only_when_asked_and_reshard_lets_them_go(group):
    ids = torch.tensor([[1, 2, 3]])
    for keep in (False, True):
        model = tiny_llama(torch.float32)
        p = TorchParallel("fsdp2", CPU, reshard_after_forward=not keep)
        p.wrap(model)
        with torch.no_grad():
            model(input_ids=ids)
        gathered = type(model.model.layers[0].mlp.up_proj.weight).__name__ != "DTensor"
        assert gathered == keep
        p.reshard(model)
        assert all(type(q).__name__ == "DTensor" for q in model.parameters())


def test_ddp_wraps_a_trainable_model_only_and_runs_the_forward_through_it(group):
    frozen = policy_model.frozen_copy(tiny_llama(torch.float32))
    p = TorchParallel("ddp", CPU)
    assert p.wrap(frozen) is frozen and p._ddp is None
    model = tiny_llama(torch.float32)
    assert p.wrap(model) is model
    assert isinstance(p._ddp, torch.nn.parallel.DistributedDataParallel) and p._ddp.module.model is model
    assert p._ddp.broadcast_buffers is False and p._ddp.device_ids is None
    calls = []
    p._ddp.register_forward_pre_hook(lambda *a: calls.append("ddp"))
    out = p.train_forward(model, lambda m, x, scale=1.0: m(input_ids=x).logits.sum() * scale,
                          torch.tensor([[1, 2]]), scale=2.0)
    assert calls == ["ddp"] and out.requires_grad
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([[1, 2]])).logits.sum() * 2.0
    assert float(out) == pytest.approx(float(expected))


@pytest.mark.parametrize("device,current,ids", [(torch.device("cuda", 1), 5, [1]), (torch.device("cuda"), 2, [2]),
                                               (CPU, 0, None)])
def test_a_gpu_workers_ddp_gets_its_gpu(group, monkeypatch, device, current, ids):
    made = []
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel",
                        lambda module, **kw: made.append((module, kw)) or "ddp")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    p = TorchParallel("ddp", device)
    model = tiny_llama(torch.float32)
    assert p.wrap(model) is model and p._ddp == "ddp"
    (module, kw), = made
    assert module.model is model and kw == {"device_ids": ids, "broadcast_buffers": False}


def test_ddp_skips_the_gradient_sync_of_all_but_the_last_micro_batch(group):
    p = TorchParallel("ddp", CPU)
    p.wrap(tiny_llama(torch.float32))
    states = []
    for last in (False, True):
        with p.micro_batch_sync(last=last):
            states.append(p._ddp.require_backward_grad_sync)
    assert states == [False, True]


@pytest.mark.parametrize("name,lora", [("fsdp2", 0), ("ddp", 0), ("fsdp2", 2), ("ddp", 2)])
def test_one_rank_makes_the_one_process_update(group, name, lora):
    # two optimizer steps of two micro-batches, the KL term and LoRA: every call of the
    # strategy (forward, no_sync, clip, normalisers, combine) is on the path
    base = tiny_llama(torch.float32)
    common = dict(lora_rank=lora, use_kl_loss=True, kl_loss_coef=0.1, global_batch_size=2, micro_batch_size=1)
    a, b = plain(base, **common), one_rank(base, name, **common)
    for rollout in range(2):
        ma, mb = a.train(rollout, train_data()), b.train(rollout, train_data())
        assert set(ma) == set(mb)
        for key in COMPARED:
            assert mb[key] == pytest.approx(ma[key], rel=1e-5, abs=1e-9), key
    assert abs(ma["train/loss"]) > 1e-4 and b.optimizer_step == 4 and b.weight_version == 2
    assert max_diff(a.weights_for_engine(), shards.full_weights(b.model, lora > 0)) < 1e-5


def test_fsdp2_bfloat16_parameters_compute_in_bfloat16_and_keep_float32_masters(group):
    base = tiny_llama(torch.float32)
    grads = []
    for dtype in ("float32", "bfloat16"):
        t = one_rank(base, "fsdp2", {"param_dtype": dtype})
        prepared = t.prepare(train_data())
        t.optimizer.zero_grad(set_to_none=True)
        t.accumulate(prepared, [0, 1, 2, 3], backward=True)
        grads.append(torch.cat([local(q.grad).flatten() for q in t.model.parameters()]))
        assert all(local(q).dtype == torch.float32 for q in t.model.parameters())
    assert grads[0].dtype == grads[1].dtype == torch.float32
    cosine = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0).item()
    assert 0.95 < cosine < 1.0


# -- shards.py: weights ---------------------------------------------------------------------


def trained_lora(base, fan_in_fan_out_model=False):
    model = policy_model.wrap_lora(base, 2, 6, 0.0, "all-linear")
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model


def test_merge_lora_gives_peft_merged_weights_under_hf_names():
    base = tiny_llama()  # float64: the merge computes in float32 and gives the base's dtype back
    model = trained_lora(copy.deepcopy(base))
    merged = shards.merge_lora(model.state_dict(), model)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(merged) == set(expected) == set(base.state_dict())
    assert all(merged[k].dtype == torch.float64 for k in merged)
    assert max_diff(merged, expected) < 1e-5
    changed = [k for k in merged if not torch.equal(merged[k], base.state_dict()[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)


def test_merge_lora_transposes_fan_in_fan_out_layers():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=2)).eval()
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn", "c_fc"],
                                            fan_in_fan_out=True, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    merged = shards.merge_lora(model.state_dict(), model)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(merged) == set(expected) and max_diff(merged, expected) < 1e-5


@pytest.mark.parametrize("lora", [0, 2])
def test_full_weights_are_plain_tensors_of_the_whole_policy_on_rank_zero(group, lora):
    base = tiny_llama(torch.float32)
    model = trained_lora(copy.deepcopy(base)) if lora else copy.deepcopy(base)
    expected = policy_model.merged_state_dict(model)
    TorchParallel("fsdp2", CPU).wrap(model)
    got = shards.full_weights(model, lora > 0)
    assert set(got) == set(expected) and all(type(v) is torch.Tensor and v.device == CPU for v in got.values())
    assert max_diff(got, expected) < 1e-6


def test_only_rank_zero_gets_the_gathered_weights(group, monkeypatch):
    model = trained_lora(tiny_llama(torch.float32))
    TorchParallel("fsdp2", CPU).wrap(model)
    assert shards._rank() == 0
    monkeypatch.setattr(shards, "_rank", lambda: 1)
    assert shards.full_weights(model, True) is None and shards.adapter_weights(model) is None


def test_rank_in_a_group_is_the_groups(group, monkeypatch):
    assert shards._rank() == 0
    monkeypatch.setattr(shards.dist, "get_rank", lambda *a, **k: 1)
    assert shards._rank() == 1


def test_rank_outside_a_group_is_zero(monkeypatch):
    assert not dist.is_initialized() and shards._rank() == 0
    monkeypatch.setattr(shards.dist, "is_available", lambda: False)
    monkeypatch.setattr(shards.dist, "is_initialized", lambda: True)
    assert shards._rank() == 0


def test_adapter_weights_are_peft_saved_tensors_and_config(group):
    from peft import get_peft_model_state_dict

    model = trained_lora(tiny_llama(torch.float32))
    expected = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    config = model.peft_config["default"].to_dict()
    TorchParallel("fsdp2", CPU).wrap(model)
    tensors, got_config = shards.adapter_weights(model)
    assert set(tensors) == set(expected) and max_diff(tensors, expected) == 0.0
    assert all(type(v) is torch.Tensor and v.is_contiguous() for v in tensors.values())
    assert got_config == config


# -- shards.py: checkpoints -----------------------------------------------------------------


def draws():
    """One draw from each process-wide random stream."""
    return torch.rand(3), np.random.rand(), random.random()


def same_draws(a, b) -> bool:
    return torch.equal(a[0], b[0]) and a[1:] == b[1:]


def dcp_keys(folder) -> set[str]:
    import torch.distributed.checkpoint as dcp

    return set(dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata)


def optimizer_state(t) -> dict:
    names = {id(p): n for n, p in t.model.named_parameters()}
    return {(names[id(p)], k): local(v).clone() for p, s in t.optimizer.state.items() for k, v in s.items()}


@pytest.mark.parametrize("lora", [0, 2])
def test_shards_round_trip_and_load_into_one_process_without_a_group(group, tmp_path, lora):
    base = tiny_llama(torch.float32)
    t = one_rank(base, "fsdp2", lora_rank=lora)
    t.train(0, train_data())
    shards.save_shards(t.model, t.optimizer, tmp_path / "s")
    assert shards.is_sharded_state(tmp_path / "s")
    trainable = {n for n, p in t.model.named_parameters() if p.requires_grad}
    # the trainable parameters only (LoRA: the adapters), with their AdamW state
    assert {k.removeprefix("model.") for k in dcp_keys(tmp_path / "s") if k.startswith("model.")} == trainable
    assert any(k.startswith("optim.state.") and k.endswith("exp_avg_sq") for k in dcp_keys(tmp_path / "s"))
    weights, state = snapshot(t.model, lora > 0), optimizer_state(t)
    # into a fresh sharded trainer of other weights (LoRA: the same frozen base, fresh adapters)
    other = base if lora else tiny_llama(torch.float32, seed=5)
    again = one_rank(other, "fsdp2", lora_rank=lora)
    _ = again.optimizer
    shards.load_shards(again.model, again.optimizer, tmp_path / "s")
    assert max_diff(shards.full_weights(again.model, lora > 0), weights) == 0.0
    assert max_diff(optimizer_state(again), state) == 0.0
    # into one process without a group: the in-process trainer resumes a distributed state
    dist.destroy_process_group()
    single = plain(other, lora_rank=lora)
    shards.load_shards(single.model, single.optimizer, tmp_path / "s")
    assert max_diff(single.weights_for_engine(), weights) == 0.0
    assert max_diff(optimizer_state(single), state) == 0.0


def test_loading_shards_in_one_process_silences_only_dcps_one_process_notice(group, tmp_path, monkeypatch):
    import warnings

    import torch.distributed.checkpoint as dcp

    t = one_rank(tiny_llama(torch.float32), "ddp")
    shards.save_shards(t.model, t.optimizer, tmp_path / "s")
    dist.destroy_process_group()
    single = plain(tiny_llama(torch.float32))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        shards.load_shards(single.model, single.optimizer, tmp_path / "s")
    assert not [w for w in seen if "torch.distributed is disabled" in str(w.message)]

    # another warning while loading still shows
    def load(state, checkpoint_id):
        warnings.warn("torch.distributed is disabled, unavailable or uninitialized, assuming ...")
        warnings.warn("something else", UserWarning)

    monkeypatch.setattr(dcp, "load", load)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        shards.load_shards(single.model, single.optimizer, tmp_path / "s")
    assert [str(w.message) for w in seen] == ["something else"]


@pytest.mark.parametrize("error,expected", [
    (RuntimeError("Missing key in checkpoint state_dict: model.x."), ValueError),
    (RuntimeError("disk on fire"), RuntimeError),
    (KeyboardInterrupt(), KeyboardInterrupt),
])
def test_a_checkpoint_without_a_parameter_is_refused_naming_the_folder(tmp_path, monkeypatch, error, expected):
    import torch.distributed.checkpoint as dcp

    def load(state, checkpoint_id):
        raise error

    monkeypatch.setattr(dcp, "load", load)
    single = plain(tiny_llama(torch.float32))
    with pytest.raises(expected) as err:
        shards.load_shards(single.model, single.optimizer, tmp_path / "s")
    if expected is ValueError:
        assert str(err.value) == (
            f"{tmp_path / 's'}: the saved trainer state does not match the model (Missing key in checkpoint "
            f"state_dict: model.x.); another model or LoRA setting (trainer.lora_rank)?")
        assert err.value.__suppress_context__
    else:
        assert err.value is error


def test_is_sharded_state_reads_dcps_metadata_file(tmp_path):
    assert not shards.is_sharded_state(tmp_path)
    (tmp_path / ".metadata").mkdir()
    assert not shards.is_sharded_state(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / ".metadata").write_bytes(b"")
    assert shards.is_sharded_state(str(tmp_path / "other"))


@pytest.mark.parametrize("name,lora", [("fsdp2", 0), ("ddp", 2)])
def test_a_one_process_state_loads_into_a_sharded_trainer(group, tmp_path, name, lora):
    base = tiny_llama(torch.float32)
    single = plain(base, lora_rank=lora)
    single.train(0, train_data())
    single.save(str(tmp_path / "one"))
    # other weights (LoRA: the same frozen base, which the state does not hold)
    t = one_rank(base if lora else tiny_llama(torch.float32, seed=5), name, lora_rank=lora)
    t.optimizer.param_groups[0].update(betas=(0.5, 0.5), lr=0.5)
    shards.load_full_state(t.model, t.optimizer, read_state(tmp_path / "one"))
    assert max_diff(shards.full_weights(t.model, lora > 0), single.weights_for_engine()) == 0.0
    assert max_diff(optimizer_state(t), optimizer_state(single)) == 0.0
    group0 = t.optimizer.param_groups[0]
    # (torch's set_state_dict rebuilds the groups: the betas come back as a list)
    assert list(group0["betas"]) == list(single.optimizer.param_groups[0]["betas"]) == [0.9, 0.999]
    assert group0["lr"] == single.optimizer.param_groups[0]["lr"] != 0.0
    # the next step is the one-process trainer's
    t.optimizer_step = single.optimizer_step
    a, b = single.train(1, train_data()), t.train(1, train_data())
    assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-5)
    assert max_diff(shards.full_weights(t.model, lora > 0), single.weights_for_engine()) < 1e-6


def test_a_one_process_state_of_another_model_is_refused(group, tmp_path):
    single = plain(tiny_llama(torch.float32))
    single.save(str(tmp_path / "one"))
    saved = read_state(tmp_path / "one")
    t = one_rank(tiny_llama(torch.float32), "ddp")
    _ = t.optimizer
    missing = dict(saved, policy={k: v for k, v in saved["policy"].items() if k != "lm_head.weight"})
    with pytest.raises(ValueError, match=exactly(
            "the saved policy does not match the model: missing ['lm_head.weight'], unknown [] (another model or "
            "LoRA setting?)")):
        shards.load_full_state(t.model, t.optimizer, missing)
    unknown = dict(saved, policy={**saved["policy"], "extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=re.escape("missing [], unknown ['extra.weight']")):
        shards.load_full_state(t.model, t.optimizer, unknown)
    lora = one_rank(tiny_llama(torch.float32), "ddp", lora_rank=2)
    # a full model's state into a LoRA one: the first five of each kind, sorted
    adapters = sorted(n for n, q in lora.model.named_parameters() if q.requires_grad)
    plain_names = sorted(saved["policy"])
    assert len(adapters) > 5 and len(plain_names) > 5
    with pytest.raises(ValueError, match=exactly(
            f"the saved policy does not match the model: missing {adapters[:5]}, unknown {plain_names[:5]} "
            f"(another model or LoRA setting?)")):
        shards.load_full_state(lora.model, lora.optimizer, saved)


def test_load_sharded_restores_rank_zeros_streams_and_the_counters(group, tmp_path):
    t = one_rank(tiny_llama(torch.float32), "fsdp2")
    t.train(0, train_data())
    folder = tmp_path / "s"
    shards.save_shards(t.model, t.optimizer, folder)
    seed_rngs(11)
    streams = rng_state()
    expected = draws()
    (folder / "trainer_state.json").write_text(json.dumps(
        {"format_version": FORMAT_VERSION, "weight_version": "4", "optimizer_step": 9.0,
         "rng": [streams, {"torch": [0]}]}))
    weights = snapshot(t.model, False)
    dist.destroy_process_group()
    single = plain(tiny_llama(torch.float32, seed=5))
    counters = shards.load_sharded(folder, single.model, single.optimizer)
    assert counters == {"weight_version": 4, "optimizer_step": 9} and type(counters["optimizer_step"]) is int
    assert same_draws(draws(), expected)
    assert max_diff(single.weights_for_engine(), weights) == 0.0
    # no streams saved: the process's own go on
    (folder / "trainer_state.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "weight_version": 1,
                                                       "optimizer_step": 1, "rng": []}))
    seed_rngs(12)
    mark = torch.get_rng_state()
    shards.load_sharded(str(folder), single.model, single.optimizer)
    assert torch.equal(torch.get_rng_state(), mark)


# -- worker.py ------------------------------------------------------------------------------


def worker_keys(checkpoint, **overrides):
    return keys(**{"hf_checkpoint": checkpoint, "num_workers": 2, "strategy": "fsdp2", **overrides})


def test_a_worker_joins_the_group_at_the_address_and_leaves_it():
    w = TrainerWorker(0, 1, 1)
    port = w.free_port()
    assert type(port) is int and port >= 1024  # one the system chose (its ephemeral range)
    with socket.socket() as s:
        s.bind(("", port))  # it was free
    w.init_group("127.0.0.1", port, "gloo", "cpu", 37)
    try:
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
        backend = dist.distributed_c10d._get_default_group()._get_backend(CPU)
        assert backend.options._timeout == datetime.timedelta(seconds=37)
    finally:
        w.close()
    assert not dist.is_initialized()
    w.close()  # no group: nothing to do


def test_a_cuda_worker_takes_the_one_gpu_it_sees(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: chosen.append(index))
    w = TrainerWorker(0, 1, 1)
    w.init_group("127.0.0.1", free_port(), "gloo", "cuda", 30)  # (gloo: the group itself on this CPU)
    try:
        assert chosen == [0] and dist.is_initialized()
    finally:
        w.close()
    w.init_group("127.0.0.1", free_port(), "gloo", "cpu", 30)
    w.close()
    assert chosen == [0]


class _StubTrainer:
    """PolicyGradientTrainer's face for `build`: records its keyword arguments and whether the
    optimizer (hence the model) was made."""

    made: list = []

    def __init__(self, *, parallel, args, **keys):
        self.parallel, self.args_given, self.keys, self.built = parallel, args, keys, False
        _StubTrainer.made.append(self)

    @property
    def optimizer(self):
        self.built = True
        return "adamw"

    @property
    def model(self):
        from torch.distributed.tensor import DTensor

        shard = SimpleNamespace(requires_grad=True, to_local=lambda: torch.zeros(3), numel=lambda: 6)
        assert not isinstance(shard, DTensor)
        return SimpleNamespace(parameters=lambda: [shard, SimpleNamespace(requires_grad=False, numel=lambda: 100),
                                                   torch.nn.Parameter(torch.zeros(4))])


def test_build_makes_the_trainer_on_the_workers_device_and_counts_its_own_shard(monkeypatch):
    from pipeline.train.distributed import worker as worker_module

    made = []

    class Recording:
        def __init__(self, *a, **kw):
            made.append((a, kw))

    _StubTrainer.made = []
    monkeypatch.setattr(worker_module, "TorchParallel", Recording)
    monkeypatch.setattr(worker_module, "PolicyGradientTrainer", _StubTrainer)
    k = yaml_keys(device="cuda", strategy="fsdp2", fsdp_wrap_modules=("LlamaDecoderLayer",),
                  fsdp_reshard_after_forward=False, param_dtype="bfloat16", gloo_collectives="native", seed=3)
    w = TrainerWorker(0, 2, 1)
    # a local shard of 3 of its 6 elements and a replicated 4: 7 trainable parameters on this rank
    assert w.build(k, {"marker": 1}) == 7
    (args, kwargs), = made
    assert args == ("fsdp2", torch.device("cuda", 0), ["LlamaDecoderLayer"], False, "bfloat16",
                    "native") and not kwargs
    t, = _StubTrainer.made
    assert t.built and w.trainer is t and t.keys == k and w.seed == 3
    assert isinstance(t.args_given, SlimeArgs) and t.args_given.marker == 1 and isinstance(t.parallel, Recording)
    w.build(yaml_keys(device="cpu", strategy="ddp", fsdp_wrap_modules=None), None)
    assert made[1][0][:3] == ("ddp", CPU, None) and _StubTrainer.made[1].args_given is None


def test_a_worker_sets_its_thread_count_and_knows_its_rank():
    before = torch.get_num_threads()
    try:
        w = TrainerWorker("1", 2.0, 2)
        assert (w.rank, w.world_size, w.trainer, w.seed) == (1, 2, None, 0)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(RuntimeError, match=exactly("trainer worker: build() first")):
        w.train(0, train_data(), [[0]])


def test_a_worker_applies_its_malloc_policy_before_anything_loads(monkeypatch):
    calls = []
    monkeypatch.setattr(worker_module.malloc, "release_freed_memory", lambda: calls.append(1) or "released")
    assert TrainerWorker(0, 2, 1, release_freed_memory=True).malloc == "released" and calls == [1]
    assert TrainerWorker(0, 2, 1).malloc == "glibc's default malloc" and calls == [1]


@pytest.mark.parametrize(("value", "strategy", "device", "expected"), [
    ("auto", "fsdp2", "cpu", True), ("auto", "ddp", "cpu", False), (True, "ddp", "cpu", True),
    (False, "fsdp2", "cpu", False), ("auto", "fsdp2", "cuda", False), ("auto", "ddp", "cuda", False),
    (True, "fsdp2", "cuda", True)])
def test_release_freed_memory_auto_is_on_for_fsdp2_on_cpu_only(value, strategy, device, expected, caplog):
    with caplog.at_level(logging.INFO, logger=driver_module.__name__):
        assert driver_module.release_freed_memory(value, strategy, device) is expected
    said = [r.getMessage() for r in caplog.records]
    # the one line where auto switches the tuning off because of CUDA, none elsewhere
    assert said == (["trainer.release_freed_memory: off (the workers train on CUDA; it tunes CPU compute only)"]
                    if (value, strategy, device) == ("auto", "fsdp2", "cuda") else [])


def test_peak_rss_is_this_processes_in_mb():
    w = TrainerWorker(0, 1, 1)
    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KB
    peak = w.peak_rss_mb()
    after_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert type(peak) is float and before_kb / 1024 <= peak <= after_kb / 1024
    # the kernel's own peak (VmHWM, kB) says the same, in MB
    hwm = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("VmHWM:"))
    assert abs(peak - hwm / 1024) < 2 and peak > 50


def test_a_worker_trains_its_rollout_and_other_ranks_get_no_weights(group, checkpoint, caplog, monkeypatch):
    caplog.set_level("INFO")
    w = TrainerWorker(0, 1, 1)
    w.build(worker_keys(checkpoint, strategy="ddp"), None)
    w.train(3, train_data(), [[0, 1], [2, 3]])
    assert "rollout 3: 2 optimizer step(s)" in caplog.text
    monkeypatch.setattr(shards, "full_weights", lambda model, lora: None)  # what another rank gets
    assert w.weights() is None


@pytest.mark.parametrize("name,lora", [("fsdp2", 0), ("ddp", 2)])
def test_a_built_worker_trains_and_gathers_as_the_one_process_trainer(group, checkpoint, name, lora):
    from pipeline.engines.weight_sync import as_tensors

    torch.set_num_threads(1)
    k = worker_keys(checkpoint, strategy=name, lora_rank=lora, use_kl_loss=True, kl_loss_coef=0.1,
                    fsdp_wrap_modules=("LlamaDecoderLayer",) if name == "fsdp2" else None)
    single = built(PolicyGradientTrainer(**{**k, "num_workers": 1, "global_batch_size": 2}))
    w = TrainerWorker(0, 1, 1)
    count = w.build(k, {"allowed_targets_extra": ["tests."], "marker": 3})
    trainable = sum(p.numel() for p in single.model.parameters() if p.requires_grad)
    assert count == trainable and type(count) is int
    assert isinstance(w.trainer.parallel, TorchParallel) and w.trainer.parallel.strategy == name
    assert w.trainer.args.marker == 3 and w.trainer.parallel.wrap_modules == (
        ["LlamaDecoderLayer"] if name == "fsdp2" else None)
    assert w.seed == 0 and w.counters() == {"weight_version": 0, "optimizer_step": 0}
    # the steps it is given: two of two samples
    a, b = single.train(0, train_data()), w.train(0, train_data(), [[0, 1], [2, 3]])
    assert w.counters() == {"weight_version": 1, "optimizer_step": 2}
    for key in COMPARED:
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-9), key
    got = w.weights()
    assert all(isinstance(v, np.ndarray) for v in got.values())
    assert max_diff(as_tensors(got), single.weights_for_engine()) < 1e-5


def test_rank_zero_keeps_the_one_process_stream_and_other_ranks_reseed(group, checkpoint):
    single = PolicyGradientTrainer(**{**worker_keys(checkpoint, seed=4), "num_workers": 1})
    _ = single.optimizer
    expected0 = torch.rand(4)
    w0 = TrainerWorker(0, 1, 1)
    w0.build(worker_keys(checkpoint, seed=4, strategy="ddp"), None)
    assert w0.seed == 4 and w0.trainer.args.seed == 4
    assert torch.equal(torch.rand(4), expected0)
    w1 = TrainerWorker(1, 2, 1)
    w1.build(worker_keys(checkpoint, seed=4, strategy="ddp"), None)
    drawn = torch.rand(4)
    seed_rngs(5)
    assert torch.equal(drawn, torch.rand(4))


def test_a_worker_saves_its_shard_and_streams_and_loads_both_layouts(group, checkpoint, tmp_path):
    w = TrainerWorker(0, 1, 1)
    w.build(worker_keys(checkpoint), None)
    w.train(0, train_data(), [[0, 1, 2, 3]])
    seed_rngs(21)
    streams = w.save(str(tmp_path / "s"))
    assert shards.is_sharded_state(tmp_path / "s") and streams == rng_state()
    expected = draws()
    weights = snapshot(w.trainer.model, False)
    w.trainer.train(1, train_data())
    w.load(str(tmp_path / "s"), streams, {"weight_version": 5.0, "optimizer_step": "6"})
    assert w.counters() == {"weight_version": 5, "optimizer_step": 6}
    assert same_draws(draws(), expected)
    assert max_diff(shards.full_weights(w.trainer.model, False), weights) == 0.0
    # a rank the checkpoint did not have: seed + rank
    w.rank = 1
    w.load(str(tmp_path / "s"), None, {"weight_version": 1, "optimizer_step": 1})
    drawn = torch.rand(3)
    seed_rngs(1)
    assert torch.equal(drawn, torch.rand(3))
    # a one-process trainer's folder: rank 0 takes its streams, the others theirs
    single = PolicyGradientTrainer(**{**worker_keys(checkpoint), "num_workers": 1})
    single.train(0, train_data())
    seed_rngs(31)
    single.save(str(tmp_path / "one"))
    after_save = torch.rand(3)
    w.rank = 0
    w.load(str(tmp_path / "one"), {"torch": [0]}, {"weight_version": 2, "optimizer_step": 2})
    assert torch.equal(torch.rand(3), after_save)
    assert max_diff(shards.full_weights(w.trainer.model, False), single.weights_for_engine()) == 0.0
    w.rank = 1
    seed_rngs(41)
    other = rng_state()
    mark = torch.rand(3)
    w.load(str(tmp_path / "one"), other, {"weight_version": 2, "optimizer_step": 2})
    assert torch.equal(torch.rand(3), mark)


def test_a_worker_loads_the_folder_it_is_given_and_rank_zero_says_so(group, checkpoint, tmp_path, caplog):
    caplog.set_level("INFO")
    w = TrainerWorker(0, 1, 1)
    w.build(worker_keys(checkpoint), None)
    saved = {}
    for name in ("a", "b"):
        w.train(0, train_data(), [[0, 1, 2, 3]])
        w.save(str(tmp_path / name))
        saved[name] = snapshot(w.trainer.model, False)
    assert max_diff(saved["a"], saved["b"]) > 0
    for name, version in (("a", 5), ("b", 6), ("a", 7)):
        w.load(str(tmp_path / name), None, {"weight_version": version, "optimizer_step": 1})
        assert max_diff(shards.full_weights(w.trainer.model, False), saved[name]) == 0.0
    assert f"trainer state loaded from {tmp_path / 'a'} (weight version 7)" in caplog.messages
    caplog.clear()
    w.rank = 1  # the other ranks load quietly
    w.load(str(tmp_path / "b"), None, {"weight_version": 8, "optimizer_step": 1})
    assert not [m for m in caplog.messages if "trainer state loaded" in m]


def test_a_lora_worker_hands_out_its_adapter(group, checkpoint):
    w = TrainerWorker(0, 1, 1)
    w.build(worker_keys(checkpoint, lora_rank=2, strategy="ddp"), None)
    w.train(0, train_data(), [[0, 1, 2, 3]])
    tensors, config = w.adapter()
    from peft import get_peft_model_state_dict

    expected = get_peft_model_state_dict(w.trainer.model)
    assert set(tensors) == set(expected) and max_diff(tensors, expected) == 0.0
    assert config == w.trainer.model.peft_config["default"].to_dict()
    merged = w.weights()
    assert max_diff(merged, policy_model.merged_state_dict(w.trainer.model)) == 0.0


# -- driver.py with a stand-in group ----------------------------------------------------------


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class _Actor:
    """A Ray actor handle's face over a worker in this process: `actor.method.remote(...)` runs it."""

    def __init__(self, worker):
        self._worker = worker

    def __getattr__(self, method):
        return _Remote(lambda *args: getattr(self._worker, method)(*args))


class InProcessGroup:
    """`WorkerGroup`'s face over real `TrainerWorker`s in this process (one rank: the test's group)."""

    made: list = []

    def __init__(self, num_workers, resume_hint):
        self.num_workers, self.resume_hint = num_workers, resume_hint
        self.workers, self.actors, self.calls, self.closed, self.started = [], [], [], 0, None
        InProcessGroup.made.append(self)

    def start(self, **kw):
        self.started = kw
        self.workers = [TrainerWorker(r, self.num_workers, kw["num_threads"]) for r in range(self.num_workers)]
        self.actors = [_Actor(w) for w in self.workers]

    def call(self, method, per_rank=None):
        per_rank = per_rank or [()] * self.num_workers
        self.calls.append((method, per_rank))
        return [getattr(w, method)(*args) for w, args in zip(self.workers, per_rank)]

    def _wait(self, refs, method, ranks):
        self.calls.append((method, ranks))
        return [ref for ref in refs]  # (each "ref" is its value already)

    def close(self):
        self.closed += 1


@pytest.fixture
def in_process(monkeypatch):
    """The groups the test's drivers made (their workers are let go before the process group is)."""
    InProcessGroup.made = []
    monkeypatch.setattr(driver_module, "WorkerGroup", InProcessGroup)
    import ray

    monkeypatch.setattr(ray, "get", lambda ref: ref)  # the "refs" are the values themselves
    yield InProcessGroup.made
    InProcessGroup.made = []


def driver_keys(checkpoint, **overrides):
    return keys(**{"hf_checkpoint": checkpoint, "num_workers": 1, "strategy": "fsdp2", **overrides})


def test_a_one_worker_driver_trains_saves_and_loads_as_the_one_process_trainer(group, checkpoint, tmp_path,
                                                                               in_process):
    args = SlimeArgs({"paths": {"output_dir": str(tmp_path / "run")}, "resume": None, "marker": 7})
    d = DistributedTrainer(args=args, **driver_keys(checkpoint))
    g = in_process[0]
    assert g.resume_hint == f"python run.py resume={tmp_path / 'run'}" and g.num_workers == 1
    assert g.started == {"address": None, "local_cpus": max(os.cpu_count() or 1, 1), "local_gpus": None,
                         "device": "cpu", "backend": "gloo", "num_cpus_per_worker": 1.0,
                         "placement_strategy": "PACK", "num_threads": 1, "timeout_s": 600.0,
                         "release_freed_memory": True}  # auto, fsdp2
    assert all(type(g.started[k]) is float for k in ("num_cpus_per_worker", "timeout_s"))
    assert type(g.started["num_threads"]) is int
    method, per_rank = g.calls[0]
    worker_keys_sent, worker_args = per_rank[0]
    assert method == "build" and worker_keys_sent == {**driver_keys(checkpoint), "device": "cpu"}
    assert worker_args["marker"] == 7 and worker_args["num_workers"] == 1
    single = PolicyGradientTrainer(**{**driver_keys(checkpoint)})
    a, b = single.train(0, train_data()), d.train(0, train_data())
    assert set(b) == set(a) | {"perf/train_token_imbalance"}
    for key in set(COMPARED) & set(a):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-9), key
    assert (d.weight_version, d.optimizer_step) == (1, 1)
    assert max_diff(d.weights_for_engine(), single.weights_for_engine()) < 1e-6
    d.save(str(tmp_path / "state"))
    meta = json.loads((tmp_path / "state" / "trainer_state.json").read_text())
    assert {k: v for k, v in meta.items() if k != "rng"} == {
        "format_version": FORMAT_VERSION, "layout": SHARDED_LAYOUT, "num_workers": 1, "strategy": "fsdp2",
        "weight_version": 1, "optimizer_step": 1}
    assert len(meta["rng"]) == 1 and set(meta["rng"][0]) >= {"torch", "python", "numpy"}
    assert shards.is_sharded_state(tmp_path / "state") and [p.name for p in tmp_path.iterdir()] == ["state"]
    after = d.train(1, train_data())
    fresh = DistributedTrainer(args=args, **driver_keys(checkpoint))
    fresh.load(str(tmp_path / "state"))
    assert (fresh.weight_version, fresh.optimizer_step) == (1, 1)
    resumed = fresh.train(1, train_data())
    assert resumed["train/loss"] == after["train/loss"]
    # the one-process trainer resumes it (no group needed)
    assert max_diff(fresh.weights_for_engine(), d.weights_for_engine()) == 0.0


def test_a_one_process_state_loads_into_the_driver(group, checkpoint, tmp_path, in_process):
    single = PolicyGradientTrainer(**driver_keys(checkpoint))
    single.train(0, train_data())
    single.save(str(tmp_path / "one"))
    single.train(1, train_data())
    d = DistributedTrainer(**driver_keys(checkpoint))
    d.load(str(tmp_path / "one"))
    assert (d.weight_version, d.optimizer_step) == (1, 1)
    method, per_rank = in_process[0].calls[-1]
    assert method == "load" and per_rank == [(str(tmp_path / "one"), None, {"weight_version": 1,
                                                                            "optimizer_step": 1})]
    d.train(1, train_data())
    assert max_diff(d.weights_for_engine(), single.weights_for_engine()) < 1e-6


def test_the_weights_are_gathered_once_per_weight_version(group, checkpoint, in_process):
    d = DistributedTrainer(**driver_keys(checkpoint, lora_rank=2))
    first = d.weights_ref_for_engine()
    assert d.weights_ref_for_engine() is first
    gathers = [c for c in in_process[0].calls if c[0] == "weights"]
    assert gathers == [("weights", [0])]
    d.train(0, train_data())
    second = d.weights_ref_for_engine()
    assert second is not first and len([c for c in in_process[0].calls if c[0] == "weights"]) == 2
    tensors = d.weights_for_engine()
    assert all(type(v) is torch.Tensor for v in tensors.values()) and max_diff(tensors, second) == 0.0


def test_the_lora_adapter_folder_loads_with_peft(group, checkpoint, tmp_path, in_process):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    d = DistributedTrainer(**driver_keys(checkpoint, lora_rank=2, strategy="ddp"))
    d.train(0, train_data())
    assert d.save_lora_adapter(str(tmp_path / "v1")) == str(tmp_path / "v1")
    assert sorted(p.name for p in (tmp_path / "v1").iterdir()) == ["adapter_config.json",
                                                                     "adapter_model.safetensors"]
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(checkpoint), str(tmp_path / "v1")).eval()
    model = in_process[0].workers[0].trainer.model
    ids = torch.tensor([train_data()["tokens"][1]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6)
    with pytest.raises(ValueError, match=exactly("save_lora_adapter needs a LoRA trainer (trainer.lora_rank > 0)")):
        DistributedTrainer(**driver_keys(checkpoint)).save_lora_adapter(str(tmp_path / "none"))


def test_the_export_is_a_plain_hf_folder_of_the_gathered_weights_and_the_tokenizer(checkpoint, tmp_path,
                                                                                  monkeypatch):
    import shutil

    from transformers import AutoModelForCausalLM

    source = tmp_path / "ckpt"
    shutil.copytree(checkpoint, source)
    (source / "tokenizer.json").write_text('{"stand-in": true}')
    trained = tiny_llama(torch.float32, seed=9)
    d = DistributedTrainer(**driver_keys(str(source)))
    monkeypatch.setattr(d, "weights_for_engine", lambda: trained.state_dict())
    folder = d.export_hf(str(tmp_path / "policy"))
    reloaded = AutoModelForCausalLM.from_pretrained(folder)
    assert max_diff(reloaded.state_dict(), trained.state_dict()) == 0.0
    assert (tmp_path / "policy" / "tokenizer.json").read_text() == '{"stand-in": true}'


def test_the_checkpoint_is_resolved_in_the_runs_cache(monkeypatch):
    asked = []
    monkeypatch.setattr(driver_module, "resolve_checkpoint", lambda ckpt, cache=None: asked.append((ckpt, cache))
                        or "/models/x")
    d = DistributedTrainer(**yaml_keys(num_workers=2, hf_checkpoint="SmolLM2-135M", cache_dir="/cache"))
    assert d._checkpoint_folder() == "/models/x" and asked == [("SmolLM2-135M", "/cache")]
    assert DistributedTrainer(**yaml_keys(num_workers=2))._checkpoint_folder() is None


def test_a_rank_one_lora_adapter_is_saved_with_safetensors_pt_metadata(tmp_path):
    from safetensors import safe_open

    model = trained_lora(tiny_llama(torch.float32))
    d, g = canned(results={"adapter": lambda per_rank: [shards.adapter_weights(model), None]}, lora_rank=1)
    d.save_lora_adapter(str(tmp_path / "v1"))
    with safe_open(str(tmp_path / "v1" / "adapter_model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    assert g.calls == [("adapter", None)]


class CannedGroup:
    """A `WorkerGroup` stand-in whose `call` records the arguments and returns canned results."""

    def __init__(self, num_workers, results=None):
        self.num_workers, self.results, self.calls, self.closed = num_workers, results or {}, [], 0

    def call(self, method, per_rank=None):
        self.calls.append((method, per_rank))
        result = self.results.get(method)
        return result(per_rank) if callable(result) else result

    def close(self):
        self.closed += 1


def canned(num_workers=2, results=None, **overrides) -> tuple[DistributedTrainer, CannedGroup]:
    d = DistributedTrainer(**yaml_keys(**{"num_workers": num_workers, **overrides}))
    d.group = CannedGroup(num_workers, results)
    return d, d.group


def grpo_data():
    """3 prompts x 2 samples of different lengths: 3, 4 | 5, 4 | 3, 6 tokens."""
    tokens = [[1, 2, 3], [1, 2, 4, 5], [6, 7, 8, 9, 9], [6, 7, 8, 1], [3, 3, 1], [3, 3, 2, 2, 2, 2]]
    lengths = [1, 2, 2, 1, 1, 4]
    return {"tokens": tokens, "response_lengths": lengths, "loss_masks": [[1] * n for n in lengths],
            "rewards": [1.0, 0.0, 1.0, 0.0, 0.5, 0.5], "round": 3}


def test_train_shares_each_step_by_tokens_and_reports_rank_zeros_metrics(caplog):
    caplog.set_level("INFO")
    results = [{"train/loss": 0.5, "train/lr": 1e-3}, {"train/loss": 9.0}]
    d, g = canned(results={"train": lambda per_rank: results}, global_batch_size=4)
    d._weights = (0, "old")
    d.weight_version, d.optimizer_step = 4, 3
    out = d.train(3, grpo_data())
    (method, per_rank), = g.calls
    assert method == "train" and [r[0] for r in per_rank] == [3, 3]
    # step 1: samples 0-3, 2 prompts: the group of 9 tokens to worker 0, the one of 7 to worker 1;
    # step 2: samples 4, 5, one prompt: one sample each, the longer one (6) to worker 0
    assert [r[1]["tokens"] for r in per_rank] == [[[6, 7, 8, 9, 9], [6, 7, 8, 1], [3, 3, 2, 2, 2, 2]],
                                                  [[1, 2, 3], [1, 2, 4, 5], [3, 3, 1]]]
    assert [r[1]["rewards"] for r in per_rank] == [[1.0, 0.0, 0.5], [1.0, 0.0, 0.5]]
    assert [r[1]["round"] for r in per_rank] == [3, 3]
    assert [r[2] for r in per_rank] == [[[0, 1], [2]], [[0, 1], [2]]]
    assert (d.weight_version, d.optimizer_step, d._weights) == (5, 5, None)
    assert out["train/loss"] == 0.5 and out["train/lr"] == 1e-3
    assert caplog.messages == ["rollout 3: 2 optimizer step(s) over 2 workers, loss 0.5, weight version 5"]
    assert out["perf/train_time"] > 0 and out["perf/train_tokens_per_sec"] == pytest.approx(
        25 / out["perf/train_time"])
    # tokens 15 and 10 of a mean of 12.5
    assert out["perf/train_token_imbalance"] == pytest.approx(15 / 12.5)
    assert set(out) == {"train/loss", "train/lr", "perf/train_time", "perf/train_tokens_per_sec",
                        "perf/train_token_imbalance"}
    assert results[0] == {"train/loss": 0.5, "train/lr": 1e-3}  # rank 0's dict is not changed


def test_train_keeps_a_rollouts_samples_in_one_step_and_hands_each_worker_the_whole_steps_weights():
    # rollout ids: samples 0 and 4 are one rollout (as are 3 and 5): one step of 2 rollouts holds both
    d, g = canned(results={"train": lambda per_rank: [{}, {}]}, global_batch_size=2)
    d.train(0, {**grpo_data(), "rollout_ids": [0, 1, 1, 2, 0, 2]})
    (_, per_rank), = g.calls
    by_sample = {}
    for _, data, steps in per_rank:
        for j, tokens in enumerate(data["tokens"]):
            by_sample[tuple(tokens)] = (data["rollout_ids"][j], data["rollout_mask_sums"][j], data["rollout_counted"][j])
        assert len(steps) == 2
    tokens = grpo_data()["tokens"]
    # masked tokens: rollout 0 = 1 + 1, rollout 1 = 2 + 2, rollout 2 = 1 + 4; one sample of each counted
    assert [by_sample[tuple(t)][:2] for t in tokens] == [(0, 2.0), (1, 4.0), (1, 4.0), (2, 5.0), (0, 2.0), (2, 5.0)]
    assert sorted(by_sample[tuple(t)][2] for t in tokens) == [0, 0, 0, 1, 1, 1]
    assert d.optimizer_step == 2


def test_train_without_samples_skips_the_rollout(caplog):
    d, g = canned()
    assert d.train(7, {"tokens": [], "response_lengths": []}) == {} and g.calls == []
    assert d.weight_version == 0 and caplog.messages == ["rollout 7: no train samples; the trainer skips this rollout"]


def test_even_shares_or_no_tokens_report_no_imbalance_and_no_time_no_rate(monkeypatch, caplog):
    caplog.set_level("INFO")
    d, g = canned(results={"train": lambda per_rank: [{}, {}]})
    monkeypatch.setattr(driver_module.time, "perf_counter", iter([1.0, 1.0, 2.0, 2.0]).__next__)
    out = d.train(0, {"tokens": [[1, 2], [3, 4]], "response_lengths": [1, 1]})
    assert out["perf/train_token_imbalance"] == 1.0 and out["perf/train_tokens_per_sec"] == 0.0
    assert out["perf/train_time"] == 0.0
    assert caplog.messages == ["rollout 0: 1 optimizer step(s) over 2 workers, loss nan, weight version 1"]
    # (empty samples never reach a worker that would refuse them: no division by zero here)
    assert d.train(1, {"tokens": [[], []], "response_lengths": [0, 0]})["perf/train_token_imbalance"] == 1.0


def test_save_writes_every_ranks_streams_and_the_counters_into_one_folder(tmp_path):
    def save(per_rank):
        for (folder,) in per_rank:
            assert Path(folder).parent == tmp_path and Path(folder).name != "state"
            Path(folder, "shard").write_text("x")
        return [{"torch": [1]}, {"torch": [2]}]

    d, g = canned(results={"save": save}, strategy="ddp")
    d.weight_version, d.optimizer_step = 3, 7
    d.save(str(tmp_path / "state"))
    (method, per_rank), = g.calls
    assert method == "save" and len(per_rank) == 2 and per_rank[0] == per_rank[1]
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["shard", "trainer_state.json"]
    assert json.loads((tmp_path / "state" / "trainer_state.json").read_text()) == {
        "format_version": FORMAT_VERSION, "layout": "dcp", "num_workers": 2, "strategy": "ddp",
        "weight_version": 3, "optimizer_step": 7, "rng": [{"torch": [1]}, {"torch": [2]}]}
    assert [p.name for p in tmp_path.iterdir()] == ["state"]


def write_meta(folder: Path, **meta) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "trainer_state.json").write_text(json.dumps(meta))
    return folder


def test_load_hands_each_rank_its_streams_and_a_new_rank_none(tmp_path, caplog):
    caplog.set_level("INFO")
    d, g = canned(num_workers=3)
    d._weights = (0, "old")
    folder = write_meta(tmp_path / "s", format_version=FORMAT_VERSION, layout="dcp", num_workers=2,
                        weight_version=4, optimizer_step=8.0, rng=["r0", "r1"])
    d.load(str(folder))
    (method, per_rank), = g.calls
    counters = {"weight_version": 4, "optimizer_step": 8}
    assert method == "load" and per_rank == [(str(folder), "r0", counters), (str(folder), "r1", counters),
                                             (str(folder), None, counters)]
    assert (d.weight_version, d.optimizer_step, d._weights) == (4, 8, None)
    assert type(d.optimizer_step) is int
    assert caplog.messages == [f"trainer state loaded from {folder} (weight version 4), saved by a trainer over 2 "
                               "workers, now fsdp2 over 3 workers (resharded)"]


def test_load_of_a_one_process_state_gives_no_streams_and_logs_the_reshard(tmp_path, caplog):
    caplog.set_level("INFO")
    d, g = canned(num_workers=2)
    folder = write_meta(tmp_path / "s", format_version=FORMAT_VERSION, weight_version=1, optimizer_step=2,
                        rng={"torch": [0]})
    d.load(folder)
    assert [r[1] for r in g.calls[0][1]] == [None, None] and g.calls[0][1][0][0] == str(folder)
    assert caplog.messages == [f"trainer state loaded from {folder} (weight version 1), saved by one process, "
                               "now fsdp2 over 2 workers (resharded)"]
    caplog.clear()
    folder = write_meta(tmp_path / "t", format_version=FORMAT_VERSION, layout="dcp", num_workers=2, strategy="ddp",
                        weight_version=1, optimizer_step=2, rng=["a", "b"])
    d.load(folder)
    assert caplog.messages == [f"trainer state loaded from {folder} (weight version 1), saved by ddp over 2 "
                               "workers, now fsdp2 over 2 workers"]


def test_load_refuses_a_folder_without_state_or_of_another_format(tmp_path):
    d, g = canned()
    with pytest.raises(FileNotFoundError, match=exactly(f"{tmp_path}: no trainer state (trainer_state.json "
                                                          f"missing)")):
        d.load(str(tmp_path))
    (tmp_path / "trainer_state.json").mkdir()
    with pytest.raises(FileNotFoundError):
        d.load(str(tmp_path))
    folder = write_meta(tmp_path / "s", format_version=FORMAT_VERSION + 1, weight_version=1, optimizer_step=1)
    with pytest.raises(ValueError, match=exactly(
            f"{folder / 'trainer_state.json'}: trainer state format {FORMAT_VERSION + 1}, expected "
            f"{FORMAT_VERSION}")):
        d.load(str(folder))
    assert g.calls == []


def test_the_driver_refuses_bad_worker_counts():
    for bad in ("2", 1.5, 0, -1):
        with pytest.raises(ValueError, match=exactly(f"trainer.num_workers must be an integer >= 1, got {bad!r}")):
            DistributedTrainer(**yaml_keys(num_workers=bad))
    d = DistributedTrainer(**yaml_keys(num_workers=1))
    assert (d.num_workers, d.weight_version, d.optimizer_step, d.group, d._args, d._weights) == (1, 0, 0, None,
                                                                                                 None, None)


def test_bind_args_gives_the_workers_the_run_args_under_the_trainer_keys(monkeypatch):
    started = []
    monkeypatch.setattr(DistributedTrainer, "start", lambda self: started.append(self))
    d = DistributedTrainer(args=SlimeArgs({"lr": 5.0, "marker": 1}), **yaml_keys(num_workers=2, lr=0.5))
    assert started == [d] and d._args["marker"] == 1 and d._args["lr"] == 0.5
    assert d.args.marker == 1 and d.args.lr == 0.5
    d.bind_args(SimpleNamespace(marker=2))
    assert d._args["marker"] == 2 and len(started) == 2
    assert DistributedTrainer(**yaml_keys(num_workers=2, lr=0.25)).args.lr == 0.25


def test_the_resume_hint_names_the_run_to_resume():
    d = DistributedTrainer(**yaml_keys(num_workers=2))
    assert d._resume_hint() == "python run.py resume=<run dir>"
    d._args = {"resume": None, "paths": {"output_dir": "runs/a"}}
    assert d._resume_hint() == f"python run.py resume={os.path.abspath('runs/a')}"
    d._args = {"resume": "/r/resumed", "paths": {"output_dir": "/r/other"}}
    assert d._resume_hint() == "python run.py resume=/r/resumed"
    d._args = {"paths": None}
    assert d._resume_hint() == "python run.py resume=<run dir>"


def test_the_workers_join_trainer_address_else_the_ray_engines():
    ray_engine = {"_target_": "pipeline.engines.ray_pool.RayEngine", "address": "ray://head:10001"}
    d = DistributedTrainer(**yaml_keys(num_workers=2))
    assert d._address() is None
    d._args = {"engine": ray_engine}
    assert d._address() == "ray://head:10001"
    d._args = {"engine": {**ray_engine, "_target_": "pipeline.engines.hf.HFEngine"}}
    assert d._address() is None
    d._args = {"engine": "ray"}
    assert d._address() is None
    d = DistributedTrainer(**yaml_keys(num_workers=2, address="auto"))
    d._args = {"engine": ray_engine}
    assert d._address() == "auto"


def test_cluster_gpus_are_rays_count_or_this_machines(monkeypatch):
    import ray

    d = DistributedTrainer(**yaml_keys(num_workers=2))
    monkeypatch.setattr(driver_module, "cuda_device_count", lambda: 3)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert d._cluster_gpus() == 3
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 2.0, "CPU": 8.0})
    assert d._cluster_gpus() == 2 and type(d._cluster_gpus()) is int
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    assert d._cluster_gpus() == 0


def test_local_cpus_count_ray_engine_replicas_and_round_up(monkeypatch):
    monkeypatch.setattr(driver_module.os, "cpu_count", lambda: None)
    d = DistributedTrainer(**yaml_keys(num_workers=3, num_cpus_per_worker=0.5))
    assert d._local_cpus() == 2
    d._args = {"engine": {"_target_": "x.RayEngine", "num_replicas": 1, "num_cpus_per_replica": 0.25,
                          "num_cpus": 0}}
    assert d._local_cpus() == 2
    d._args = {"engine": {"_target_": "x.RayEngine", "num_replicas": 2, "num_cpus_per_replica": 0.5}}
    assert d._local_cpus() == 3
    d._args = {"engine": {"_target_": "x.HFEngine", "num_replicas": 9, "num_cpus_per_replica": 9}}
    assert d._local_cpus() == 2
    d = DistributedTrainer(**yaml_keys(num_workers=1, num_cpus_per_worker=0.5))
    assert d._local_cpus() == 1


def test_local_gpus_of_a_cuda_run_on_a_local_ray(monkeypatch):
    monkeypatch.setattr(driver_module, "cuda_device_count", lambda: 2)
    d = DistributedTrainer(**yaml_keys(num_workers=2))
    assert d._local_gpus("cuda", None) == 2
    d._args = {"engine": {"_target_": driver_module.HF_ENGINE, "colocate": False, "device": "auto"}}
    assert d._local_gpus("cuda", None) == 1
    d._args = {"engine": {"_target_": driver_module.HF_ENGINE, "colocate": None, "device": "cuda"}}
    assert d._local_gpus("cuda", None) == 2
    d._args = {"engine": {"_target_": "x.OtherEngine", "colocate": False, "device": "cuda"}}
    assert d._local_gpus("cuda", None) == 2


class Recording(CannedGroup):
    """A WorkerGroup stand-in that records how it was started; `build` reports 11 parameters each."""

    made: list = []

    def __init__(self, num_workers, resume_hint):
        super().__init__(num_workers, {"build": lambda per_rank: [11] * num_workers})
        self.resume_hint = resume_hint
        Recording.made.append(self)

    def start(self, **kw):
        self.started = kw


@pytest.mark.parametrize(("reserved", "threads"), [(1, 1), (0.5, 1), (2.9, 2), (8, 8)])
def test_auto_threads_are_each_workers_ray_reservation(checkpoint, monkeypatch, caplog, reserved, threads):
    """trainer.num_threads=auto over N workers: trainer.num_cpus_per_worker rounded down, at least
    1, for the workers' OMP_NUM_THREADS and torch threads alike (their keys get the number)."""
    caplog.set_level("INFO")
    Recording.made = made = []
    monkeypatch.setattr(driver_module, "WorkerGroup", Recording)
    d = DistributedTrainer(**yaml_keys(num_workers=2, hf_checkpoint=checkpoint, strategy="ddp", num_threads="auto",
                                       num_cpus_per_worker=reserved, address="auto"))
    monkeypatch.setattr(d, "_cluster_gpus", lambda: 0)
    d.start()
    g, = made
    assert g.started["num_threads"] == threads and type(g.started["num_threads"]) is int
    (method, per_rank), = g.calls
    assert per_rank[0][0]["num_threads"] == threads and d.keys["num_threads"] == "auto"
    assert caplog.messages[0] == (f"trainer.num_threads: auto -> {threads} (per worker: "
                                  f"trainer.num_cpus_per_worker={reserved}, the CPUs Ray reserves for each)")
    d.close()


def test_start_places_the_workers_and_builds_the_trainer_once(checkpoint, monkeypatch, caplog):
    caplog.set_level("INFO")
    Recording.made = made = []
    monkeypatch.setattr(driver_module, "WorkerGroup", Recording)
    d = DistributedTrainer(**yaml_keys(num_workers=2, hf_checkpoint=checkpoint, strategy="ddp", num_threads=2,
                                       num_cpus_per_worker=1, collective_timeout_s=30, address="auto"))
    monkeypatch.setattr(d, "_cluster_gpus", lambda: 0)
    d._args = {"engine": {}}
    d.start()
    d.start()
    g, = made
    assert d.group is g and d._group() is g
    assert g.started["address"] == "auto" and g.started["local_gpus"] is None
    assert (g.started["num_threads"], g.started["timeout_s"]) == (2, 30.0)
    (method, per_rank), = g.calls
    assert method == "build" and per_rank == [({**d.keys, "device": "cpu"}, {"engine": {}})] * 2
    assert caplog.messages == ["trainer: ddp over 2 workers, trainable parameters per worker [11, 11]"]
    d.close()
    d.close()
    assert d.group is None and g.closed == 1
    assert d._group() is made[1]


@pytest.mark.parametrize("address,cluster,local,device,local_gpus", [
    ("auto", 2, 0, "cuda", None),  # a cluster's GPUs decide, Ray counts them
    (None, 2, 0, "cpu", None),     # a local Ray: this machine's (none)
    (None, 0, 3, "cuda", 3),       # this machine's 3 GPUs, declared to the local Ray
])
def test_the_workers_device_is_judged_by_the_gpus_where_they_run(monkeypatch, address, cluster, local, device,
                                                                  local_gpus):
    from pipeline.cluster import devices

    Recording.made = []
    monkeypatch.setattr(driver_module, "WorkerGroup", Recording)
    monkeypatch.setattr(devices, "cuda_device_count", lambda: local)
    monkeypatch.setattr(driver_module, "cuda_device_count", lambda: local)
    d = DistributedTrainer(**yaml_keys(num_workers=2, device="auto", address=address, strategy="ddp"))
    monkeypatch.setattr(d, "_cluster_gpus", lambda: cluster)
    d.start()
    started = Recording.made[0].started
    assert (started["device"], started["backend"], started["local_gpus"]) == (
        device, "nccl" if device == "cuda" else "gloo", local_gpus)
    assert Recording.made[0].calls[0][1][0][0]["device"] == device


def test_a_cuda_trainer_without_gpus_is_refused_naming_its_key(monkeypatch):
    from pipeline.cluster import devices
    from pipeline.cluster.devices import DeviceError

    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    monkeypatch.setattr(driver_module, "WorkerGroup", lambda *a: pytest.fail("a worker started"))
    with pytest.raises(DeviceError, match=r"^trainer\.device=cuda, but this machine has no CUDA device"):
        DistributedTrainer(**yaml_keys(num_workers=2, device="cuda", strategy="ddp")).start()
    monkeypatch.setattr(driver_module, "cuda_device_count", lambda: 0)
    d = DistributedTrainer(**yaml_keys(num_workers=2))
    d._args = {"engine": {"_target_": driver_module.HF_ENGINE, "colocate": False, "device": "cuda"}}
    with pytest.raises(DeviceError, match=r"^engine\.device=cuda, but this machine has no CUDA device"):
        d._local_gpus("cuda", None)


def test_a_start_that_fails_stops_the_workers(checkpoint, monkeypatch):
    made = []

    class Failing(CannedGroup):
        def __init__(self, num_workers, resume_hint):
            super().__init__(num_workers)
            made.append(self)

        def start(self, **kw):
            raise KeyboardInterrupt

    monkeypatch.setattr(driver_module, "WorkerGroup", Failing)
    d = DistributedTrainer(**yaml_keys(num_workers=2, hf_checkpoint=None, strategy="ddp"))
    with pytest.raises(KeyboardInterrupt):
        d.start()
    assert d.group is None and made[0].closed == 1


def test_fsdp2_refuses_a_model_it_cannot_shard_before_any_worker_starts(checkpoint, monkeypatch):
    monkeypatch.setattr(driver_module, "WorkerGroup", lambda *a: pytest.fail("a worker started"))
    d = DistributedTrainer(**yaml_keys(num_workers=2, hf_checkpoint=checkpoint, fsdp_wrap_modules=["NoSuchLayer"]))
    with pytest.raises(ValueError, match=re.escape("LlamaForCausalLM has no module of class ['NoSuchLayer']")):
        d.start()
    # no checkpoint folder: nothing to check
    DistributedTrainer(**yaml_keys(num_workers=2, fsdp_wrap_modules=["NoSuchLayer"]))._check_shardable()
    # the model is built on the meta device: no weights read
    built = []
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_config
    monkeypatch.setattr(AutoModelForCausalLM, "from_config",
                        lambda config: built.append(real(config)) or built[-1])
    DistributedTrainer(**yaml_keys(num_workers=2, hf_checkpoint=checkpoint))._check_shardable()
    assert built and all(p.device.type == "meta" for p in built[0].parameters())


# -- group.py without Ray ---------------------------------------------------------------------


class _Ref:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error


class _FakeActor:
    def __init__(self, rank, results):
        self.rank, self.results = rank, results

    def __getattr__(self, method):
        def remote(*args):
            value = self.results[self.rank]
            return value if isinstance(value, _Ref) else _Ref((method, self.rank, args, value))
        return _Remote(remote)


@pytest.fixture
def fake_ray(monkeypatch):
    """Ray's wait / get / kill / remove_placement_group and the runtime's release, recorded."""
    import importlib

    import ray

    pg = importlib.import_module("ray.util.placement_group")  # (ray.util.placement_group is also a function)
    log = SimpleNamespace(waits=[], timeouts=[], killed=[], removed=[], released=[])

    def wait(pending, num_returns, timeout=None):
        assert num_returns == 1
        log.waits.append(len(pending))
        log.timeouts.append(timeout)
        return pending[:1], pending[1:]

    def get(ref):
        if isinstance(ref, list):
            return [get(r) for r in ref]
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(actor):
        log.killed.append(actor.rank)
        if actor.rank == 0:
            raise ValueError("dead already")

    def remove(pg_):
        log.removed.append(pg_)
        raise RuntimeError("gone")

    monkeypatch.setattr(ray, "wait", wait)
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "kill", kill)
    monkeypatch.setattr(pg, "remove_placement_group", remove)
    monkeypatch.setattr(group_module.ray_runtime, "release", lambda lease: log.released.append(lease))
    # a joined cluster whose GCS answers, unless a test says otherwise
    log.last_lease, log.gcs_up = False, True
    monkeypatch.setattr(group_module.ray_runtime, "shuts_down_with", lambda lease: log.last_lease and lease == "lease")
    monkeypatch.setattr(group_module.ray_runtime, "gcs_reachable", lambda: log.gcs_up)
    return log


def running_group(results, num_workers=2, where=None) -> WorkerGroup:
    g = WorkerGroup(num_workers, "python run.py resume=/runs/r")
    g.actors = [_FakeActor(r, results) for r in range(num_workers)]
    g.where = where if where is not None else [{"ip": f"10.0.0.{r}", "host": f"h{r}", "pid": 100 + r}
                                               for r in range(num_workers)]
    g._lease, g._pg = "lease", "pg"
    return g


def test_a_new_group_has_no_workers():
    g = WorkerGroup(2.0, "hint")
    assert (g.num_workers, g.resume_hint, g.actors, g.where, g._pg, g._lease) == (2, "hint", [], [], None, None)
    assert issubclass(TrainerWorkerError, RuntimeError)


def test_call_runs_the_method_on_every_worker_and_returns_rank_order(fake_ray):
    g = running_group(["a", "b"])
    assert g.call("train", [(1, "x"), (2, "y")]) == [("train", 0, (1, "x"), "a"), ("train", 1, (2, "y"), "b")]
    assert fake_ray.waits == [2, 1]
    assert g.call("counters") == [("counters", 0, (), "a"), ("counters", 1, (), "b")]
    assert g.call_one(1, "free_port", 5) == ("free_port", 1, (5,), "b")
    with pytest.raises(ValueError):
        g.call("train", [(1,)])  # one argument tuple per worker


def test_call_on_stopped_workers_is_refused():
    with pytest.raises(TrainerWorkerError, match=exactly(
            "trainer: the workers are stopped (an earlier failure, or close())")):
        WorkerGroup(2, "hint").call("train")


def test_a_dead_worker_stops_the_group_and_names_itself_and_the_resume(fake_ray):
    import ray

    g = running_group([_Ref("ok"), _Ref(error=ray.exceptions.RayActorError())])
    with pytest.raises(TrainerWorkerError) as err:
        g.call("train")
    assert str(err.value) == (
        "trainer worker 1 of 2 died during train (node 10.0.0.1 (h1), pid 101): RayActorError; the other "
        "workers were stopped. The newest checkpoint is complete (a save in progress leaves only a temp "
        "folder); continue with: python run.py resume=/runs/r")
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert g.actors == [] and fake_ray.killed == [0, 1] and fake_ray.removed == ["pg"]
    assert fake_ray.released == ["lease"] and (g._pg, g._lease) == (None, None)


def test_a_worker_that_died_before_saying_where_is_named_by_rank(fake_ray):
    import ray

    g = running_group([_Ref("ok"), _Ref(error=ray.exceptions.RayActorError())], where=[])
    with pytest.raises(TrainerWorkerError, match=re.escape(
            "trainer worker 1 of 2 died during where (node ? (?), pid ?): RayActorError")):
        g.call_one(1, "where")
    g = running_group([_Ref("ok"), _Ref("ok")], where=[{"ip": "1.2.3.4"}])
    assert "(node 1.2.3.4 (?), pid ?)" in g._died(0, "m", ValueError())
    assert "trainer worker 1 of 2 died during m (node ? (?), pid ?): ValueError;" in g._died(1, "m", ValueError())


def test_a_worker_that_raises_stops_the_group_and_reraises_its_error_with_a_note(fake_ray):
    import ray

    cause = KeyError("bad hook")
    g = running_group([_Ref("ok"), _Ref(error=ray.exceptions.RayTaskError("train", "tb", cause))])
    with pytest.raises(KeyError) as err:
        g.call("build")
    assert err.value is cause and err.value.__cause__ is None and err.value.__suppress_context__
    assert cause.__notes__ == ["raised by trainer worker 1 of 2 in build; the workers were stopped"]
    assert g.actors == [] and fake_ray.released == ["lease"]


GLOO_RESET = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [10.0.0.1]:4242: Connection reset by peer"


@pytest.mark.parametrize("message", [GLOO_RESET, "connection closed by peer", "Connection refused", "Broken pipe",
                                     "Gloo timed out", "NCCL error: remote process exited", "socket timeout"])
def test_a_transport_error_names_the_peer_ray_reports_dead(fake_ray, message):
    import ray

    g = running_group([_Ref(error=ray.exceptions.RayTaskError("train", "tb", RuntimeError(message))),
                       _Ref("ok"), _Ref(error=ray.exceptions.RayActorError())], num_workers=3)
    with pytest.raises(TrainerWorkerError) as err:
        g.call("train")
    assert str(err.value).startswith(
        "trainer worker 2 of 3 died during train (node 10.0.0.2 (h2), pid 102): RayActorError; the other workers "
        "were stopped.") and err.value.__suppress_context__ and err.value.__cause__ is None
    # the survivor's answer is passed over, the dead peer found, each wait within the grace period
    assert fake_ray.waits == [3, 2, 1] and fake_ray.timeouts[0] is None
    assert all(group_module.PEER_DEATH_GRACE_S - 1 < t <= group_module.PEER_DEATH_GRACE_S
               for t in fake_ray.timeouts[1:])
    assert g.actors == [] and fake_ray.killed == [0, 1, 2] and fake_ray.released == ["lease"]


def test_a_transport_error_with_every_peer_alive_is_reraised_after_the_wait(fake_ray):
    import ray

    cause = RuntimeError(GLOO_RESET)
    other = ray.exceptions.RayTaskError("train", "tb", RuntimeError("Connection closed by peer"))
    g = running_group([_Ref(error=ray.exceptions.RayTaskError("train", "tb", cause)), _Ref(error=other),
                       _Ref("ok")], num_workers=3)
    with pytest.raises(RuntimeError) as err:
        g.call("train")
    assert err.value is cause and cause.__notes__ == ["raised by trainer worker 0 of 3 in train; the workers were "
                                                      "stopped"]
    assert fake_ray.waits == [3, 2, 1] and g.actors == []


def test_a_transport_error_waits_no_longer_than_the_grace_period(fake_ray, monkeypatch):
    import ray

    monkeypatch.setattr(group_module, "PEER_DEATH_GRACE_S", 0.0)
    cause = RuntimeError(GLOO_RESET)
    g = running_group([_Ref(error=ray.exceptions.RayTaskError("train", "tb", cause)),
                       _Ref(error=ray.exceptions.RayActorError())])
    with pytest.raises(RuntimeError) as err:
        g.call("train")
    assert err.value is cause and fake_ray.waits == [2]


def test_the_grace_period_ends_the_wait_at_its_deadline(fake_ray, monkeypatch):
    import ray

    clock = iter([100.0, 109.5, 110.0])  # the deadline is set, half a second is left, none is
    monkeypatch.setattr(group_module, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    cause = RuntimeError(GLOO_RESET)
    g = running_group([_Ref(error=ray.exceptions.RayTaskError("train", "tb", cause)), _Ref("ok"),
                       _Ref(error=ray.exceptions.RayActorError())], num_workers=3)
    with pytest.raises(RuntimeError) as err:
        g.call("train")
    assert err.value is cause and fake_ray.waits == [3, 2] and fake_ray.timeouts == [None, 0.5]


def test_a_workers_own_error_does_not_wait_for_its_peers(fake_ray):
    import ray

    cause = ValueError("bad reward hook")
    g = running_group([_Ref(error=ray.exceptions.RayTaskError("train", "tb", cause)),
                       _Ref(error=ray.exceptions.RayActorError())])
    with pytest.raises(ValueError) as err:
        g.call("train")
    assert err.value is cause and fake_ray.waits == [2]


def test_a_worker_failure_without_an_exception_is_a_trainer_worker_error(fake_ray):
    import ray

    error = ray.exceptions.RayTaskError("train", "the traceback", None)
    g = running_group([_Ref(error=error), _Ref("ok")])
    with pytest.raises(TrainerWorkerError) as err:
        g.call("train")
    assert str(err.value) == f"trainer worker 0 failed in train: {error}" and err.value.__suppress_context__
    assert g.actors == [] and fake_ray.waits == [2]


def test_close_stops_every_worker_once_and_releases_ray(fake_ray):
    g = running_group(["a", "b"])
    g.close()
    assert fake_ray.killed == [0, 1] and fake_ray.removed == ["pg"] and fake_ray.released == ["lease"]
    assert (g.actors, g._pg, g._lease) == ([], None, None)
    g.close()
    assert fake_ray.killed == [0, 1] and fake_ray.released == ["lease"]
    # workers without a lease (a start that failed half-way) are stopped too; no placement group to free
    g = running_group(["a", "b"])
    g._lease = g._pg = None
    g.close()
    assert fake_ray.killed == [0, 1, 0, 1] and fake_ray.removed == ["pg"] and fake_ray.released == ["lease", None]


@pytest.mark.parametrize("last_lease, gcs_up, removed", [(False, True, ["pg"]), (True, True, []),
                                                         (False, False, [])])
def test_close_frees_the_placement_group_only_where_it_outlives_the_run_and_the_gcs_answers(
        fake_ray, caplog, last_lease, gcs_up, removed):
    """A local Ray that stops with this lease takes the placement group along; a GCS that is gone
    (removing would wait 60 s and end the run) took it along: the workers are stopped and the
    lease released either way."""
    caplog.set_level("INFO")
    fake_ray.last_lease, fake_ray.gcs_up = last_lease, gcs_up
    g = running_group(["a", "b"])
    g.close()
    assert fake_ray.removed == removed and fake_ray.killed == [0, 1] and fake_ray.released == ["lease"]
    assert (g.actors, g._pg, g._lease) == ([], None, None)
    assert caplog.messages == ([] if gcs_up else
                               ["trainer: the Ray cluster's GCS is gone; the workers' placement group went with it"])


def test_workers_import_what_the_driver_imports_and_get_their_thread_count(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setattr(sys, "path", ["", str(tmp_path / "a"), str(tmp_path / "missing"), str(tmp_path / "b")])
    for key in ("GLIBC_TUNABLES", *malloc_module.ENV_KEYS):
        monkeypatch.delenv(key, raising=False)
    assert worker_env(3) == {"PYTHONPATH": f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}", "OMP_NUM_THREADS": "3",
                             "TOKENIZERS_PARALLELISM": "false"}
    # a worker that releases freed memory starts with glibc's huge-page tunable, after the user's
    assert worker_env(3, release_freed_memory=True) == {**worker_env(3), "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert worker_env(1, True)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert worker_env(1, False).get("GLIBC_TUNABLES") is None
