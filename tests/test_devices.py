"""pipeline/cluster/devices.py: which GPU the hf engine takes, what is left to the trainer, and when
the process-level CPU tunings (omp_spin_count, keep_freed_memory) switch themselves off."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pipeline.run import app

from pipeline.process import malloc

from pipeline.process import openmp
from pipeline.cluster import devices
from pipeline.cluster.devices import (DeviceError, engine_gpu_index, gpus_for_trainer, process_cpu_idle,
                                      process_tuning_note)
from pipeline.process.openmp import ENV_KEYS, configure_openmp_wait

CONF = Path(__file__).resolve().parents[1] / "conf"


def _node(group: str, option: str, **over: Any) -> dict[str, Any]:
    """conf/<group>/<option>.yaml as written (interpolations unresolved), with `over` applied."""
    node = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"), resolve=False)
    node.update(over)
    return node


# -- which GPU -------------------------------------------------------------------------------------

@pytest.mark.parametrize("visible,colocate,index", [(1, True, 0), (1, False, 0), (4, True, 0), (4, False, 3),
                                                    (2, False, 1)])
def test_the_engine_takes_cuda_0_colocated_and_the_last_gpu_of_its_own_otherwise(
        visible: int, colocate: bool, index: int) -> None:
    assert engine_gpu_index(visible, colocate) == index


@pytest.mark.parametrize("colocate", [True, False])
def test_no_gpu_for_the_engine_is_refused_naming_the_key(colocate: bool) -> None:
    with pytest.raises(DeviceError, match="engine.device resolves to cuda, but no GPU is visible.*engine.device=cpu"):
        engine_gpu_index(0, colocate)


@pytest.mark.parametrize("visible,own,left", [(4, True, 3), (4, False, 4), (2, True, 1), (1, False, 1)])
def test_the_trainer_gets_every_gpu_but_the_engines_own(visible: int, own: bool, left: int) -> None:
    assert gpus_for_trainer(visible, own) == left


def test_one_gpu_taken_by_the_engine_leaves_none_and_suggests_colocate() -> None:
    with pytest.raises(DeviceError) as err:
        gpus_for_trainer(1, True)
    assert "this machine has 1 GPU and the hf engine takes it for itself" in str(err.value)
    assert "set engine.colocate=true" in str(err.value)


@pytest.mark.parametrize("own", [True, False])
def test_no_gpu_for_the_trainer_is_refused_naming_the_key(own: bool) -> None:
    with pytest.raises(DeviceError, match="trainer.device resolves to cuda, but no GPU is visible"):
        gpus_for_trainer(0, own)


@pytest.mark.parametrize("mask,shown", [(None, "CUDA_VISIBLE_DEVICES is not set"), ("", "CUDA_VISIBLE_DEVICES=''"),
                                        ("0,1", "CUDA_VISIBLE_DEVICES='0,1'")])
def test_the_refusals_show_the_gpu_mask_or_that_it_is_not_set(monkeypatch, mask, shown) -> None:
    if mask is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)
    for call, key in ((lambda: engine_gpu_index(0, True), "engine.device resolves to cuda"),
                      (lambda: gpus_for_trainer(0, False), "trainer.device resolves to cuda"),
                      (lambda: devices.resolve_device("cuda", "trainer.device", 0), "trainer.device=cuda")):
        with pytest.raises(DeviceError) as err:
            call()
        assert str(err.value).startswith(key) and f"({shown}); use " in str(err.value)


# -- when the process-level CPU tunings switch off ------------------------------------------------

PG = "policy_gradient"
# (engine option, engine.device, trainer option, trainer overrides, GPUs visible, off?)
CASES = [
    ("hf", "cuda", "none", {}, 1, True),
    ("hf", "auto", "none", {}, 2, True),
    ("hf", "auto", "none", {}, 0, False),            # auto on a CPU-only machine: the CPU
    ("hf", "auto", "none", {}, None, False),         # only torch could tell: keep the tunings
    ("hf", "cpu", "none", {}, 2, False),
    ("hf", "cuda", "function", {}, 1, True),
    ("hf", "cuda", PG, {"device": "cpu"}, 1, False),  # the trainer computes on the CPU here
    ("hf", "cuda", PG, {"device": "cuda"}, 1, True),
    ("hf", "cuda", PG, {"device": "auto"}, 1, True),
    ("hf", "cuda", PG, {"device": "auto"}, None, False),
    ("hf", "cuda", PG, {"device": "cpu", "num_workers": 2}, 1, True),  # its workers are other processes
    ("hf", "cuda", PG, {"device": "cpu", "num_workers": 1}, 1, False),
    ("hf", "cuda", PG, {"device": "gpu"}, 1, False),  # invalid: pre-flight refuses it, tunings kept
    ("ray", "cuda", "none", {}, 2, False),           # the driver of Ray replicas: not the hf engine
    ("scripted", None, "none", {}, 2, False),
]


@pytest.mark.parametrize("engine,device,trainer,over,gpus,off", CASES)
def test_the_cpu_tunings_switch_off_only_when_nothing_here_computes_on_the_cpu(
        engine: str, device: str | None, trainer: str, over: dict[str, Any], gpus: int | None, off: bool) -> None:
    engine_node = _node("engine", engine, **({} if device is None else {"device": device}))
    reason = process_cpu_idle(engine_node, _node("trainer", trainer, **over), gpus)
    assert (reason is not None) == off
    if off:
        assert reason.startswith("nothing in this process computes on the CPU: the hf engine")


def test_the_reason_says_what_runs_where() -> None:
    hf = _node("engine", "hf", device="cuda")
    assert process_cpu_idle(hf, _node("trainer", PG, num_workers=3), 1).endswith(
        "the trainer's 3 workers are processes of their own")
    assert process_cpu_idle(hf, _node("trainer", PG, device="cuda"), 1).endswith(
        "the hf engine and the trainer run on cuda")
    assert process_tuning_note("omp_spin_count", "why") == "omp_spin_count: off (why; it tunes CPU compute only)"


def test_omp_spin_count_off_sets_nothing_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ENV_KEYS:
        monkeypatch.setenv(key, "placeholder")
        monkeypatch.delenv(key)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as before torch loads: it would apply otherwise
    monkeypatch.setattr(openmp, "_APPLIED", {})
    line = configure_openmp_wait(10000, "nothing here")
    assert line == "omp_spin_count: off (nothing here; it tunes CPU compute only)"
    assert not any(key in os.environ for key in ENV_KEYS)
    assert "not applied (pre-flight checks it)" in configure_openmp_wait(-1, "nothing here")


def test_keep_freed_memory_off_calls_no_mallopt(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(malloc, "_mallopt", lambda: lambda p, v: calls.append((p, v)) or 1)
    for key in malloc.ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    with malloc.keep_freed_memory(True, "nothing here") as said:
        assert said == "keep_freed_memory: off (nothing here; it tunes CPU compute only)"
    assert calls == []
    with malloc.keep_freed_memory(True) as said:  # without a reason: applied as before
        assert said.startswith("freed memory stays in the process for reuse")
    assert calls


def _compose(tmp_path: Path, *overrides: str) -> Any:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": f"What is {i} + 1?", "label": str(i + 1)}) + "\n" for i in range(8)))
    base = [f"paths.output_dir={tmp_path}/run", f"data_source.prompt_data={data}", f"paths.cache_dir={tmp_path}/c",
            "data_source.apply_chat_template=false", "rollout_batch_size=2", "n_samples_per_prompt=2",
            "num_rollout=1", "allowed_targets_extra=[tests.]", "rollout=function",
            "rollout.path=tests.plugins.slime_plugins.generate_rollout", "logger=jsonl"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=base + list(overrides))


@pytest.mark.parametrize("overrides,gpus,off", [
    (["engine.device=cuda"], 1, True), (["engine.device=cpu"], 1, False), ([], 0, False), ([], 1, True),
    (["trainer=policy_gradient", "trainer.device=cpu", "engine.device=cuda"], 1, False),
    (["trainer=policy_gradient", "trainer.num_workers=2", "engine.device=cuda"], 1, True),
])
def test_the_run_decides_from_its_composed_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  overrides: list[str], gpus: int, off: bool) -> None:
    monkeypatch.setattr(app, "visible_gpus", lambda: gpus)
    assert (app._cpu_idle(_compose(tmp_path, *overrides)) is not None) == off


@pytest.mark.timeout(120)
def test_a_run_with_the_hf_engine_on_cuda_logs_both_tunings_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """app.run end to end (a rollout function that needs no model, so nothing loads): with one
    GPU counted, engine.device=cuda passes pre-flight, and the run logs one line per tuning off."""
    from pipeline.engines import preflight

    for module in (app, preflight):
        monkeypatch.setattr(module, "visible_gpus", lambda: 1)
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 1)  # the engine is built, not started
    caplog.set_level(logging.INFO, logger="pipeline.run.app")
    app.run(_compose(tmp_path, "engine.device=cuda"))
    said = [r.getMessage() for r in caplog.records if r.name == "pipeline.run.app"]
    why = "nothing in this process computes on the CPU: the hf engine runs on cuda and no trainer computes in it"
    assert f"omp_spin_count: off ({why}; it tunes CPU compute only)" in said
    assert f"keep_freed_memory: off ({why}; it tunes CPU compute only)" in said
