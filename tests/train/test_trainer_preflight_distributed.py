"""Pre-flight of where trainer=policy_gradient trains (num_workers, strategy, device, backend,
Ray placement, GPUs, the global batch's split): `validate` refuses what cannot run and warns of
CPU workers that would contend for cores; the CUDA branches are pinned by patching the GPU count."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from pipeline.cluster import devices
from pipeline.config.args import ConfigError, to_plain_lenient, validate
from pipeline.train.preflight import trainer_problems, trainer_warnings

pytestmark = pytest.mark.timeout(120)

CONF = Path(__file__).resolve().parents[2] / "conf"
# the hf engine off the GPUs (engine.device=auto would take one of its own): the trainer's GPUs are
# all of them. ++: engine.device may not be in conf/engine/hf.yaml yet
CPU_ENGINE = "++engine.device=cpu"


def compose_cfg(tmp: Path, *overrides: str) -> Any:
    """The shipped config with trainer=policy_gradient and `overrides` (default batch: 4 prompts x 4 samples)."""
    base = [f"paths.output_dir={tmp}/out", f"paths.cache_dir={tmp}/cache", "data_source.apply_chat_template=false",
            "trainer=policy_gradient"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=base + list(overrides))


def gpus(monkeypatch: pytest.MonkeyPatch, count: int | None, torch_count: int | None = None) -> None:
    """This machine's GPUs as pre-flight sees them: `visible_gpus()` answers `count`, torch's count
    `torch_count` (default: `count`)."""
    monkeypatch.setattr(devices, "visible_gpus", lambda: count)
    answer = count if torch_count is None else torch_count
    monkeypatch.setattr(devices, "cuda_device_count", lambda: answer)


def counted_torch(monkeypatch: pytest.MonkeyPatch, visible: int | None, torch_count: int) -> list[int]:
    """`visible_gpus()` answers `visible`, torch `torch_count`; the list grows by one per torch call."""
    calls: list[int] = []
    monkeypatch.setattr(devices, "visible_gpus", lambda: visible)

    def count() -> int:
        calls.append(torch_count)
        return torch_count

    monkeypatch.setattr(devices, "cuda_device_count", count)
    return calls


def no_torch(monkeypatch: pytest.MonkeyPatch, visible: int | None) -> None:
    """`visible_gpus()` answers `visible`; asking torch for a CUDA count fails the test."""
    monkeypatch.setattr(devices, "visible_gpus", lambda: visible)

    def refuse() -> int:
        raise AssertionError("pre-flight asked torch for a CUDA count")

    monkeypatch.setattr(devices, "cuda_device_count", refuse)


def cpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: count)


def config_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "pipeline.config.args" and r.levelno >= logging.WARNING]


def refused(tmp: Path, *overrides: str) -> str:
    """The message `validate` raises for `overrides` (fails the test when it passes)."""
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(tmp, *overrides))
    return str(info.value)


@pytest.mark.parametrize("machine_gpus", [0, None, 2])
def test_the_default_single_worker_passes_quietly_without_asking_torch(tmp_path, monkeypatch, caplog, machine_gpus):
    """num_workers=1, device=auto: no problem, no warning, and no CUDA count asked of torch (nothing
    the in-process trainer's checks need depends on it), whatever the machine's GPUs."""
    no_torch(monkeypatch, machine_gpus)
    cfg = to_plain_lenient(compose_cfg(tmp_path))
    assert cfg["trainer"]["num_workers"] == 1 and cfg["trainer"]["device"] == "auto"
    assert trainer_problems(cfg) == [] and trainer_warnings(cfg) == []
    gpus(monkeypatch, machine_gpus, torch_count=machine_gpus or 0)
    with caplog.at_level(logging.WARNING):
        validate(compose_cfg(tmp_path))
    assert config_warnings(caplog) == []


def test_two_cpu_workers_with_a_splittable_batch_pass_quietly(tmp_path, monkeypatch, caplog):
    gpus(monkeypatch, 0)
    cpus(monkeypatch, 8)
    with caplog.at_level(logging.WARNING):
        validate(compose_cfg(tmp_path, "trainer.num_workers=2"))
        validate(compose_cfg(tmp_path, "trainer.num_workers=2", "trainer.strategy=ddp", "trainer.backend=gloo",
                             "trainer.global_batch_size=2", "trainer.fsdp_wrap_modules=[LlamaDecoderLayer]",
                             "trainer.address=auto", "trainer.placement_strategy=STRICT_SPREAD",
                             "trainer.num_cpus_per_worker=0.5", "trainer.collective_timeout_s=30"))
    assert config_warnings(caplog) == []


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.num_workers=0"], "trainer.num_workers=0: expected an integer >= 1"),
    (["trainer.num_workers=-2"], "trainer.num_workers=-2: expected an integer >= 1"),
    (["trainer.num_workers=1.5"], "trainer.num_workers=1.5: expected an integer >= 1"),
    (["trainer.num_workers=true"], "trainer.num_workers=True: expected an integer >= 1"),
    (["trainer.num_workers=two"], "trainer.num_workers='two': expected an integer >= 1"),
    (["trainer.strategy=zero3"], "trainer.strategy='zero3': expected one of ['fsdp2', 'ddp']"),
    (["trainer.device=tpu"], "trainer.device='tpu': expected one of ['auto', 'cpu', 'cuda']"),
    (["trainer.backend=mpi"], "trainer.backend='mpi': expected one of ['auto', 'gloo', 'nccl']"),
    (["trainer.placement_strategy=pack"],
     "trainer.placement_strategy='pack': expected one of ['PACK', 'SPREAD', 'STRICT_PACK', 'STRICT_SPREAD']"),
    (["trainer.num_cpus_per_worker=0"], "trainer.num_cpus_per_worker=0: expected a number > 0"),
    (["trainer.num_cpus_per_worker=true"], "trainer.num_cpus_per_worker=True: expected a number > 0"),
    (["trainer.collective_timeout_s=-1"], "trainer.collective_timeout_s=-1: expected a number > 0"),
    (["trainer.collective_timeout_s=soon"], "trainer.collective_timeout_s='soon': expected a number > 0"),
    (["trainer.address=5"], "trainer.address=5: expected null (the run's Ray, or a local one) or a Ray address"),
    (["trainer.address=''"], "trainer.address='': expected null"),
    (["trainer.fsdp_wrap_modules=LlamaDecoderLayer"],
     "trainer.fsdp_wrap_modules='LlamaDecoderLayer': expected null (the model's own _no_split_modules) or a list "
     "of module class names"),
    (["trainer.fsdp_wrap_modules=[LlamaDecoderLayer,'']"], "trainer.fsdp_wrap_modules=['LlamaDecoderLayer', '']"),
    (["trainer.fsdp_wrap_modules=[1]"], "trainer.fsdp_wrap_modules=[1]: expected null"),
    (["trainer.release_freed_memory=1"], "trainer.release_freed_memory=1: expected true, false or auto"),
    (["trainer.release_freed_memory=always"], "trainer.release_freed_memory='always': expected true, false or auto"),
])
def test_bad_values_are_refused_naming_the_key(tmp_path, monkeypatch, overrides, message):
    gpus(monkeypatch, 0)
    text = refused(tmp_path, *overrides)
    assert message in text
    assert text.count("\n  - ") == 1, text  # that one problem, nothing else


def test_cuda_without_a_gpu_is_refused_with_resolve_devices_message(tmp_path, monkeypatch):
    for visible, torch_count in ((0, 0), (None, 0)):  # no driver; a driver node but torch sees none
        gpus(monkeypatch, visible, torch_count)
        text = refused(tmp_path, "trainer.device=cuda")
        assert "trainer.device=cuda, but this machine has no CUDA device torch can use" in text
        assert "use trainer.device=cpu or trainer.device=auto" in text
    gpus(monkeypatch, 1)
    validate(compose_cfg(tmp_path, "trainer.device=cuda", CPU_ENGINE))


def test_nccl_on_a_cpu_trainer_is_refused(tmp_path, monkeypatch):
    gpus(monkeypatch, 0)
    nccl = "trainer.backend=nccl needs CUDA tensors, but the trainer runs on the CPU; use trainer.backend=gloo"
    assert nccl in refused(tmp_path, "trainer.device=cpu", "trainer.backend=nccl")
    assert nccl in refused(tmp_path, "trainer.num_workers=2", "trainer.backend=nccl")  # auto on a CPU-only machine
    gpus(monkeypatch, 2)
    assert nccl in refused(tmp_path, "trainer.num_workers=2", "trainer.device=cpu", "trainer.backend=nccl")
    validate(compose_cfg(tmp_path, "trainer.num_workers=2", "trainer.backend=nccl", CPU_ENGINE))  # auto: CUDA here


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_more_cuda_workers_than_gpus_are_refused_naming_the_count(tmp_path, monkeypatch, device):
    gpus(monkeypatch, 2)
    validate(compose_cfg(tmp_path, f"trainer.device={device}", "trainer.num_workers=2", CPU_ENGINE))
    text = refused(tmp_path, f"trainer.device={device}", "trainer.num_workers=3", CPU_ENGINE)
    assert ("trainer.num_workers=3 on CUDA needs one GPU per worker, but this machine has 2 GPU(s): 2 for the "
            "trainer; set trainer.num_workers=2, trainer.device=cpu or trainer.address=") in text
    assert "engine" not in text


def test_the_hf_engine_on_a_gpu_of_its_own_takes_one_from_the_workers(tmp_path, monkeypatch):
    """engine.device / engine.colocate: set with ++ (they may not be in conf/engine/hf.yaml yet);
    checked on the config validate sees, through the trainer's pre-flight function."""
    gpus(monkeypatch, 2)
    own = ["trainer.device=cuda", "trainer.num_workers=2", "++engine.device=cuda", "++engine.colocate=false"]
    [problem] = trainer_problems(to_plain_lenient(compose_cfg(tmp_path, *own)))
    assert problem.startswith("trainer.num_workers=2 on CUDA needs one GPU per worker, but this machine has 2 GPU(s) "
                              "and the hf engine keeps one of its own (engine.colocate=false): 1 for the trainer; "
                              "set trainer.num_workers=1, engine.colocate=true")
    assert trainer_problems(to_plain_lenient(compose_cfg(tmp_path, *own[:-1], "++engine.colocate=true"))) == []
    assert trainer_problems(to_plain_lenient(compose_cfg(tmp_path, *own[:2], "++engine.device=cpu"))) == []
    gpus(monkeypatch, 1)  # one GPU, the engine's: even one in-process CUDA trainer has none left
    [problem] = trainer_problems(to_plain_lenient(compose_cfg(tmp_path, *own[:1], *own[2:])))
    assert problem == ("trainer.num_workers=1 on CUDA needs one GPU per worker, but this machine has 1 GPU(s) and the "
                       "hf engine keeps one of its own (engine.colocate=false): 0 for the trainer; set "
                       "engine.colocate=true (the engine shares worker 0's GPU), engine.device=cpu or "
                       "trainer.device=cpu")


def test_a_ray_cluster_has_gpus_of_its_own(tmp_path, monkeypatch):
    """trainer.address (or engine=ray's address) set: the workers' nodes have the GPUs, not this
    machine; nothing is counted here."""
    gpus(monkeypatch, 0)
    validate(compose_cfg(tmp_path, "trainer.device=cuda", "trainer.num_workers=4", "trainer.address=auto"))
    validate(compose_cfg(tmp_path, "trainer.device=cuda", "trainer.num_workers=4", "engine=ray", "engine.address=auto"))
    assert "this machine has 0 GPU" not in refused(tmp_path, "trainer.device=cuda", "trainer.num_workers=4",
                                                   "trainer.backend=mpi")
    assert "no CUDA device" in refused(tmp_path, "trainer.device=cuda", "trainer.num_workers=4", "engine=ray")


def test_a_global_batch_smaller_than_the_workers_is_refused_with_the_sizes(tmp_path, monkeypatch):
    gpus(monkeypatch, 0)
    text = refused(tmp_path, "trainer.num_workers=3", "trainer.global_batch_size=2")
    assert ("trainer.num_workers=3: trainer.global_batch_size=2 samples per optimizer step cannot be split over 3 "
            "workers (each needs at least one sample); set trainer.global_batch_size >= 3 (or null: the whole "
            "rollout) or trainer.num_workers <= 2") in text
    text = refused(tmp_path, "trainer.num_workers=3", "rollout_batch_size=1", "n_samples_per_prompt=2")
    assert ("trainer.num_workers=3: an optimizer step (trainer.global_batch_size=null: the whole rollout, "
            "rollout_batch_size=1 x n_samples_per_prompt=2 = 2 samples) cannot be split over 3 workers") in text
    assert "raise rollout_batch_size or n_samples_per_prompt, or set trainer.num_workers <= 2" in text
    text = refused(tmp_path, "trainer.num_workers=3", "rollout_batch_size=1", "n_samples_per_prompt=2",
                   "trainer.global_batch_size=8")
    assert "trainer.global_batch_size=8 is capped at the whole rollout, rollout_batch_size=1 x" in text
    cpus(monkeypatch, 8)
    validate(compose_cfg(tmp_path, "trainer.num_workers=3", "trainer.global_batch_size=3"))
    validate(compose_cfg(tmp_path, "trainer.num_workers=2", "rollout_batch_size=1", "n_samples_per_prompt=2"))
    validate(compose_cfg(tmp_path, "trainer.global_batch_size=1"))  # one worker: any step size


def test_more_cpu_worker_threads_than_cpus_is_a_warning(tmp_path, monkeypatch, caplog):
    gpus(monkeypatch, 0)
    cpus(monkeypatch, 2)
    with caplog.at_level(logging.WARNING):
        validate(compose_cfg(tmp_path, "trainer.num_workers=2", "trainer.num_threads=2"))
    assert config_warnings(caplog) == [
        "config: trainer.num_workers=2 x trainer.num_threads=2 = 4 torch threads on the CPU, more than this "
        "machine's 2 CPUs (os.cpu_count()): the workers contend for cores and every step gets slower; set "
        "trainer.num_threads=1 or fewer workers (trainer.num_workers=1)"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        validate(compose_cfg(tmp_path, "trainer.num_workers=2", "trainer.num_threads=1"))  # 2 threads: fits
        validate(compose_cfg(tmp_path, "trainer.num_workers=2"))  # auto: 1 thread each (num_cpus_per_worker)
        validate(compose_cfg(tmp_path, "trainer.num_threads=4"))  # one in-process trainer: no workers
        validate(compose_cfg(tmp_path, "trainer.num_workers=2", "trainer.num_threads=2", "trainer.address=auto"))
        validate(compose_cfg(tmp_path, "trainer.strategy=ddp"))  # a strategy with one worker: quiet
        gpus(monkeypatch, 2)
        validate(compose_cfg(tmp_path, "trainer.num_workers=2", "trainer.num_threads=2", CPU_ENGINE))  # on CUDA
    assert config_warnings(caplog) == []


def test_where_it_trains_is_checked_for_the_policy_gradient_trainer_only(tmp_path, monkeypatch):
    gpus(monkeypatch, 0)
    cfg = to_plain_lenient(compose_cfg(tmp_path, "trainer=function",
                                       "trainer.train_function_path=pipeline.stages.log.rollout_metrics"))
    cfg["trainer"].update(num_workers=0, device="cuda", backend="nccl")
    assert trainer_problems(cfg) == [] and trainer_warnings(cfg) == []
    assert re.search(r"trainer\.num_workers=0", "\n".join(trainer_problems(
        to_plain_lenient(compose_cfg(tmp_path, "trainer.num_workers=0")))))


def test_param_dtype_bfloat16_needs_fsdp2_workers(tmp_path, monkeypatch):
    gpus(monkeypatch, 0)
    assert "trainer.param_dtype=bfloat16 is FSDP2's mixed precision" in refused(tmp_path, "trainer.param_dtype=bfloat16")
    assert "got num_workers=2, strategy='ddp'" in refused(
        tmp_path, "trainer.param_dtype=bfloat16", "trainer.num_workers=2", "trainer.strategy=ddp")
    validate(compose_cfg(tmp_path, "trainer.param_dtype=bfloat16", "trainer.num_workers=2", "rollout_batch_size=2"))
    assert "trainer.param_dtype='fp8': expected one of ['float32', 'bfloat16']" in refused(
        tmp_path, "trainer.param_dtype=fp8")


# --- the same checks on plain config dicts (no compose: each a few milliseconds) ---
TARGET = "pipeline.train.build.policy_gradient_trainer"
HF = "pipeline.engines.hf.HFEngine"


def plain(engine: dict[str, Any] | None = None, rbs: Any = 4, n: Any = 4, **trainer: Any) -> dict[str, Any]:
    """A config as pre-flight sees it: the shipped trainer keys (device=cpu unless given), `trainer`
    over them, the hf engine on the CPU unless `engine`, `rbs` prompts x `n` samples."""
    from trainer_fixtures import yaml_keys

    keys = yaml_keys(**{"device": "cpu", **trainer})
    keys["_target_"] = TARGET
    return {"trainer": keys, "engine": {"_target_": HF, "device": "cpu"} if engine is None else engine,
            "rollout_batch_size": rbs, "n_samples_per_prompt": n}


NCCL_ON_CPU = ("trainer.backend=nccl needs CUDA tensors, but the trainer runs on the CPU; use trainer.backend=gloo "
               "(or auto), or trainer.device=cuda on a machine with GPUs")


def test_device_cpu_asks_torch_nothing_and_trains_on_the_cpu(monkeypatch):
    """trainer.device=cpu: the CPU, here or on a Ray cluster's nodes (nccl refused either way),
    without a GPU count from torch even on a machine with GPUs."""
    no_torch(monkeypatch, 2)
    assert trainer_problems(plain(num_workers=2)) == []
    assert trainer_problems(plain(num_workers=2, backend="nccl")) == [NCCL_ON_CPU]
    assert trainer_problems(plain(num_workers=2, backend="nccl", address="auto")) == [NCCL_ON_CPU]


def test_no_visible_gpu_asks_torch_nothing(monkeypatch):
    """No GPU visible (no driver, or CUDA_VISIBLE_DEVICES hides them): 0 GPUs without torch's count,
    for N workers on auto (the CPU) and for cuda (refused)."""
    no_torch(monkeypatch, 0)
    assert trainer_problems(plain(num_workers=2, device="auto")) == []
    assert trainer_problems(plain(num_workers=2, device="auto", backend="nccl")) == [NCCL_ON_CPU]
    [problem] = trainer_problems(plain(num_workers=2, device="cuda"))
    assert problem.startswith("trainer.device=cuda, but this machine has no CUDA device torch can use")


def test_torch_is_asked_once_for_cuda_workers_and_the_hf_engine(monkeypatch):
    """The trainer's GPU count is the one the hf engine's device is judged by: torch is asked once."""
    calls = counted_torch(monkeypatch, None, 3)
    cuda_engine = {"_target_": HF, "device": "auto", "colocate": False}
    assert trainer_problems(plain(engine=cuda_engine, num_workers=2, device="cuda")) == []
    assert calls == [3]
    calls.clear()
    [problem] = trainer_problems(plain(engine=cuda_engine, num_workers=3, device="auto"))
    assert calls == [3]
    assert problem == ("trainer.num_workers=3 on CUDA needs one GPU per worker, but this machine has 3 GPU(s) and the "
                       "hf engine keeps one of its own (engine.colocate=false): 2 for the trainer; set "
                       "trainer.num_workers=2, engine.colocate=true (the engine shares worker 0's GPU), "
                       "engine.device=cpu, trainer.device=cpu or trainer.address=<a Ray cluster with more GPUs>")


def test_two_auto_workers_on_a_driver_without_proc_listing_ask_torch(monkeypatch):
    """visible_gpus() None (only torch can tell): two workers on auto count torch's GPUs, and
    two CUDA workers on one GPU are refused, word for word."""
    calls = counted_torch(monkeypatch, None, 1)
    assert trainer_problems(plain(num_workers=2, device="auto")) == [
        "trainer.num_workers=2 on CUDA needs one GPU per worker, but this machine has 1 GPU(s): 1 for the trainer; "
        "set trainer.num_workers=1, trainer.device=cpu or trainer.address=<a Ray cluster with more GPUs>"]
    assert calls == [1]
    counted_torch(monkeypatch, None, 0)  # torch sees none: the CPU, where nccl is refused
    assert trainer_problems(plain(num_workers=2, device="auto", backend="nccl")) == [NCCL_ON_CPU]


def test_the_engine_keeps_a_gpu_only_as_the_hf_engine_on_cuda_not_colocated(monkeypatch):
    """An engine that is not the hf engine, or an hf engine whose device pre-flight cannot resolve
    (its own checks report it), takes no GPU from the trainer; an hf engine on CUDA without
    engine.colocate keeps one of its own."""
    counted_torch(monkeypatch, 2, 2)
    for engine in ({"_target_": "pipeline.engines.ray_pool.RayEngine", "device": "cuda"},
                   {"_target_": "pipeline.engines.vllm.VLLMEngine", "device": "cuda", "colocate": False}, None,
                   {"_target_": HF, "device": "tpu", "colocate": False}, {"_target_": HF},
                   {"_target_": HF, "device": "cuda", "colocate": True}):
        cfg = plain(num_workers=2, device="cuda")
        cfg["engine"] = engine
        assert trainer_problems(cfg) == [], engine
    [problem] = trainer_problems(plain(engine={"_target_": HF, "device": "cuda"}, num_workers=2, device="cuda"))
    assert problem.startswith("trainer.num_workers=2 on CUDA needs one GPU per worker, but this machine has 2 GPU(s) "
                              "and the hf engine keeps one of its own (engine.colocate=false): 1 for the trainer")


def test_cuda_workers_on_a_ray_cluster_train_on_cuda(monkeypatch):
    """trainer.address set: the nodes have the GPUs; cuda there takes nccl (and auto, gloo)."""
    no_torch(monkeypatch, 0)
    for backend in ("nccl", "gloo", "auto"):
        assert trainer_problems(plain(num_workers=2, device="cuda", address="auto", backend=backend)) == [], backend
    assert trainer_problems(plain(num_workers=2, device="cuda", backend="nccl",
                                  engine={"_target_": "pipeline.engines.ray_pool.RayEngine",
                                          "address": "ray://head:10001"})) == []


def test_a_global_batch_of_one_cannot_be_split_over_two_workers(monkeypatch):
    no_torch(monkeypatch, 0)
    assert trainer_problems(plain(num_workers=2, global_batch_size=1)) == [
        "trainer.num_workers=2: trainer.global_batch_size=1 samples per optimizer step cannot be split over 2 "
        "workers (each needs at least one sample); set trainer.global_batch_size >= 2 (or null: the whole rollout) "
        "or trainer.num_workers <= 1"]
    assert trainer_problems(plain(num_workers=2, global_batch_size=2)) == []


def test_a_rollout_of_one_sample_cannot_be_split_over_two_workers(monkeypatch):
    no_torch(monkeypatch, 0)
    assert trainer_problems(plain(num_workers=2, rbs=1, n=1)) == [
        "trainer.num_workers=2: an optimizer step (trainer.global_batch_size=null: the whole rollout, "
        "rollout_batch_size=1 x n_samples_per_prompt=1 = 1 samples) cannot be split over 2 workers (each needs at "
        "least one sample); raise rollout_batch_size or n_samples_per_prompt, or set trainer.num_workers <= 1"]
    assert trainer_problems(plain(num_workers=2, rbs=2, n=1)) == []
    assert trainer_problems(plain(num_workers=2, rbs=1, n=2)) == []


@pytest.mark.parametrize(("rbs", "n"), [(0, 1), (1, 0), (0, 0), (1, None), (None, 1), (1.5, 1), (1, 1.5)])
def test_a_rollout_size_that_is_not_a_positive_integer_is_left_to_its_own_checks(monkeypatch, rbs, n):
    """rollout_batch_size / n_samples_per_prompt of 0 or not an integer: their own checks refuse
    them; the split check says nothing."""
    no_torch(monkeypatch, 0)
    assert trainer_problems(plain(num_workers=4, rbs=rbs, n=n)) == []


def test_cpu_workers_warn_of_contention_with_device_cpu(monkeypatch):
    no_torch(monkeypatch, 0)
    cpus(monkeypatch, 2)
    assert trainer_warnings(plain(num_workers=4, num_threads=1)) == [
        "trainer.num_workers=4 x trainer.num_threads=1 = 4 torch threads on the CPU, more than this machine's 2 CPUs "
        "(os.cpu_count()): the workers contend for cores and every step gets slower; set fewer workers "
        "(trainer.num_workers=2)"]  # (already 1 thread each: fewer threads is no fix)
    assert trainer_warnings(plain(num_workers=2, num_threads=1)) == []
    assert trainer_warnings(plain(num_workers=2, num_threads=2, address="auto")) == []  # the cluster's CPUs
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: nothing to compare with
    assert trainer_warnings(plain(num_workers=4, num_threads=4)) == []


def test_auto_threads_are_the_reservation_in_the_contention_warning(monkeypatch):
    """trainer.num_threads=auto is each worker's trainer.num_cpus_per_worker (at least 1): the
    shipped default fits 2 workers on 2 CPUs; a reservation past the cores is warned about."""
    no_torch(monkeypatch, 0)
    cpus(monkeypatch, 2)
    assert trainer_warnings(plain(num_workers=2, num_threads="auto")) == []
    assert trainer_warnings(plain(num_workers=2, num_threads="auto", num_cpus_per_worker=2)) == [
        "trainer.num_workers=2 x trainer.num_threads=auto (2: trainer.num_cpus_per_worker=2) = 4 torch threads on "
        "the CPU, more than this machine's 2 CPUs (os.cpu_count()): the workers contend for cores and every step "
        "gets slower; set trainer.num_threads=1 or fewer workers (trainer.num_workers=1)"]
    assert trainer_warnings(plain(num_workers=4, num_threads="auto", num_cpus_per_worker=0.5)) == [
        "trainer.num_workers=4 x trainer.num_threads=auto (1: trainer.num_cpus_per_worker=0.5) = 4 torch threads "
        "on the CPU, more than this machine's 2 CPUs (os.cpu_count()): the workers contend for cores and every "
        "step gets slower; set fewer workers (trainer.num_workers=2)"]
    cpus(monkeypatch, 8)
    assert trainer_warnings(plain(num_workers=4, num_threads="auto", num_cpus_per_worker=2)) == []
    assert trainer_warnings(plain(num_workers=4, num_threads="auto", num_cpus_per_worker=3)) == [
        "trainer.num_workers=4 x trainer.num_threads=auto (3: trainer.num_cpus_per_worker=3) = 12 torch threads "
        "on the CPU, more than this machine's 8 CPUs (os.cpu_count()): the workers contend for cores and every "
        "step gets slower; set trainer.num_threads=2 or fewer workers (trainer.num_workers=2)"]


def test_no_contention_warning_for_a_config_with_problems_or_without_the_trainer(monkeypatch):
    no_torch(monkeypatch, 0)
    cpus(monkeypatch, 2)
    assert trainer_warnings(plain(num_workers=4, num_threads=4, placement_strategy="pack")) == []
    assert trainer_warnings({"trainer": None}) == [] and trainer_warnings({}) == []
    function = plain(num_workers=4, num_threads=4)
    function["trainer"]["_target_"] = "pipeline.train.function.FunctionTrainer"
    assert trainer_warnings(function) == []


@pytest.mark.parametrize("threads", [None, "4", 2.5, 0, -1, True])
def test_no_contention_warning_for_a_thread_count_that_is_not_a_positive_integer(monkeypatch, threads):
    """trainer.num_threads is refused by trainer_problems; the warning neither fails on it nor
    multiplies it (2 workers x 2.5 threads would be "5 torch threads")."""
    no_torch(monkeypatch, 0)
    cpus(monkeypatch, 2)
    assert trainer_warnings(plain(num_workers=2, num_threads=threads)) == []
