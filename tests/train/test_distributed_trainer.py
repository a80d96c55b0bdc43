"""The trainer over N torch.distributed workers on Ray (trainer.num_workers=2, gloo on this CPU)
against the one-process trainer on the same data: losses, weights, checkpoints in both
directions, random streams, and a worker that dies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading

import pytest
import torch

from pipeline.config.args import SlimeArgs
from pipeline.process.malloc import HUGE_PAGES_TUNABLE
from pipeline.train.build import policy_gradient_trainer
from pipeline.train.distributed.driver import DistributedTrainer
from pipeline.train.distributed.group import TrainerWorkerError
from pipeline.train.policy_gradient import PolicyGradientTrainer
from trainer_fixtures import tiny_llama, yaml_keys

pytestmark = pytest.mark.slow

torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def ray_up():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray's socket paths must stay under 107 bytes: a short folder in /tmp, not pytest's deep tmp_path.
    temp = tempfile.mkdtemp(prefix="ray_")
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=temp, log_to_driver=False)
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny")
    tiny_llama(torch.float32).save_pretrained(folder)
    return str(folder)


def grpo_data() -> dict:
    """10 samples, 5 prompts x 2 answers of 1-4 tokens, one loss-mask zero, mixed rewards."""
    tokens, lengths, masks, rewards = [], [], [], []
    for g in range(5):
        prompt = [1 + g, 5 + g, 7 + g][: 2 + g % 2]
        for j in range(2):
            n = 1 + (g + j) % 4
            tokens.append(prompt + [(11 + 3 * g + 5 * j + k) % 32 for k in range(n)])
            lengths.append(n)
            masks.append([0 if (g, j, k) == (2, 1, 0) else 1 for k in range(n)])
            rewards.append(1.0 if (g + j) % 2 else -0.5)
    return {"tokens": tokens, "response_lengths": lengths, "loss_masks": masks, "rewards": rewards,
            "rollout_log_probs": [[-3.4 - 0.05 * k for k in range(n)] for n in lengths]}


def keys(checkpoint, **overrides):
    return yaml_keys(hf_checkpoint=checkpoint, lr=1e-3, micro_batch_size=2, loss_agg_mode="token-mean",
                     entropy_coef=0.01, **overrides)


def distributed(checkpoint, run_dir="/tmp/unused", **overrides) -> DistributedTrainer:
    args = SlimeArgs({"paths": {"output_dir": run_dir}, "resume": None, "allowed_targets_extra": ["tests."]})
    t = policy_gradient_trainer(args=args, **keys(checkpoint, num_workers=2, collective_timeout_s=60, **overrides))
    assert isinstance(t, DistributedTrainer)
    return t


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("strategy,lora", [("fsdp2", 0), ("ddp", 0), ("fsdp2", 4), ("ddp", 4)])
def test_two_workers_make_the_one_process_update(checkpoint, strategy, lora, tmp_path):
    # 5 optimizer steps of 2 samples (each one prompt: split by sample) and one of all 10
    # (split by prompt), the KL term on: every normaliser and every term crosses the workers
    common = dict(lora_rank=lora, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k3", strategy=strategy)
    local = PolicyGradientTrainer(**keys(checkpoint, **common))
    dist = distributed(checkpoint, **common)
    try:
        # fsdp2 workers release freed memory and were started with glibc's huge-page tunable
        notes = {w["malloc"] for w in dist.group.where}
        if strategy == "fsdp2":
            assert len(notes) == 1 and "freed memory goes back to the OS at once" in notes.pop(), dist.group.where
            assert all(HUGE_PAGES_TUNABLE in w["malloc"] and "started without" not in w["malloc"]
                       for w in dist.group.where)
        else:
            assert notes == {"glibc's default malloc"}
        for rollout, gbs in enumerate((2, None)):
            local.keys["global_batch_size"] = dist.keys["global_batch_size"] = gbs
            a, b = local.train(rollout, grpo_data()), dist.train(rollout, grpo_data())
            for key in ("train/loss", "train/pg_loss", "train/entropy", "train/kl_loss", "train/grad_norm"):
                assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key
            assert abs(a["train/loss"]) > 1e-3
        assert dist.optimizer_step == local.optimizer_step == 6 and dist.weight_version == 2
        assert max_diff(local.weights_for_engine(), dist.weights_for_engine()) < 1e-5
        if lora:  # the adapter folder engines load (vLLM's runtime LoRA): peft's files, the same tensors
            from safetensors.torch import load_file

            folders = [t.save_lora_adapter(str(tmp_path / name)) for t, name in ((local, "one"), (dist, "two"))]
            one, two = (load_file(f"{f}/adapter_model.safetensors") for f in folders)
            assert one.keys() == two.keys() and max_diff(one, two) < 1e-5
            configs = [json.loads((tmp_path / name / "adapter_config.json").read_text()) for name in ("one", "two")]
            assert configs[0]["r"] == configs[1]["r"] == 4
            assert sorted(configs[0]["target_modules"]) == sorted(configs[1]["target_modules"])
    finally:
        dist.close()


def test_a_step_with_fewer_samples_than_workers_and_the_per_sample_pass(checkpoint):
    # 3 samples per step: the last step of 10 has one sample, so one worker has none of it
    common = dict(global_batch_size=3, share_prompt_forward=False, use_dynamic_batch_size=True,
                  max_tokens_per_gpu=12)
    local = PolicyGradientTrainer(**keys(checkpoint, **common))
    dist = distributed(checkpoint, **common)
    try:
        a, b = local.train(0, grpo_data()), dist.train(0, grpo_data())
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-6)
        assert dist.optimizer_step == 4
        assert max_diff(local.weights_for_engine(), dist.weights_for_engine()) < 1e-5
    finally:
        dist.close()


def test_checkpoints_reshard_both_ways_and_resume_exactly(checkpoint, tmp_path):
    hooks = dict(loss_type="custom_loss",
                 custom_loss_function_path="tests.plugins.trainer_hooks.draw_random_streams")
    two = distributed(checkpoint)
    try:
        two.train(0, grpo_data())
        two.save(str(tmp_path / "two"))
        saved = json.loads((tmp_path / "two" / "trainer_state.json").read_text())
        assert saved["layout"] == "dcp" and saved["num_workers"] == 2 and len(saved["rng"]) == 2
        after = two.train(1, grpo_data())
        expected = two.weights_for_engine()
    finally:
        two.close()
    # 2 -> 2: bit-identical continuation
    again = distributed(checkpoint)
    try:
        again.load(str(tmp_path / "two"))
        assert again.weight_version == 1
        resumed = again.train(1, grpo_data())
        assert resumed["train/loss"] == after["train/loss"] and resumed["train/grad_norm"] == after["train/grad_norm"]
        assert max_diff(again.weights_for_engine(), expected) == 0.0
    finally:
        again.close()
    # 2 -> 1 and 1 -> 2
    one = PolicyGradientTrainer(**keys(checkpoint))
    one.load(str(tmp_path / "two"))
    assert one.train(1, grpo_data())["train/loss"] == pytest.approx(after["train/loss"], rel=1e-6)
    assert max_diff(one.weights_for_engine(), expected) < 1e-5
    one.save(str(tmp_path / "one"))
    back = distributed(checkpoint)
    try:
        back.load(str(tmp_path / "one"))
        assert back.weight_version == 2
        assert max_diff(back.weights_for_engine(), one.weights_for_engine()) == 0.0
        b, c = back.train(2, grpo_data()), one.train(2, grpo_data())
        assert b["train/loss"] == pytest.approx(c["train/loss"], rel=1e-6)
    finally:
        back.close()
    # every rank's random streams continue after a save and a load into fresh workers
    first = distributed(checkpoint, **hooks)
    try:
        first.train(0, grpo_data())
        first.save(str(tmp_path / "rng"))
        uninterrupted = first.train(1, grpo_data())
    finally:
        first.close()
    fresh = distributed(checkpoint, **hooks)
    try:
        drawn_fresh = fresh.train(0, grpo_data())
        fresh.load(str(tmp_path / "rng"))
        continued = fresh.train(1, grpo_data())
    finally:
        fresh.close()
    streams = {k: v for k, v in uninterrupted.items() if k.startswith("train/rng_")}
    assert len(streams) == 6  # torch, numpy, python on each of 2 ranks
    assert {k: continued[k] for k in streams} == streams
    assert all(drawn_fresh[k] != streams[k] for k in streams)  # not a re-seed: the streams moved on


@pytest.mark.parametrize("when", ["before the step", "during a step"])
def test_a_killed_worker_stops_the_run_naming_it(checkpoint, tmp_path, when):
    dist = distributed(checkpoint, run_dir=str(tmp_path / "run"))
    pid = dist.group.where[1]["pid"]
    if when == "before the step":
        os.kill(pid, signal.SIGKILL)
    else:  # rank 0 then sees gloo's "Connection reset by peer" before Ray sees worker 1 exit
        threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
    with pytest.raises(TrainerWorkerError) as err:
        for step in range(50):
            dist.train(step, grpo_data())
    text = str(err.value)
    assert "trainer worker 1 of 2 died during train" in text and f"pid {pid}" in text
    assert f"python run.py resume={tmp_path / 'run'}" in text
    assert dist.group is None or not dist.group.actors  # the other worker is stopped too
    dist.close()


def test_a_model_fsdp2_cannot_shard_is_refused_naming_the_class(checkpoint):
    with pytest.raises(ValueError, match=r"trainer.strategy=fsdp2: LlamaForCausalLM has no module of class "
                                         r"\['NoSuchLayer'\]"):
        distributed(checkpoint, fsdp_wrap_modules=["NoSuchLayer"])
