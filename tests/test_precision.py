"""`auto` precision (pipeline/process/precision.py): bfloat16 only where this CPU runs it fast, for the
hf engine's `dtype` and the trainer's `bf16`."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.process import precision
from pipeline.engines.hf import HFEngine
from pipeline.train.policy_gradient import PolicyGradientTrainer
from tests.train.trainer_fixtures import tiny_llama, yaml_keys

CONF = Path(__file__).resolve().parents[1] / "conf"


def _cpu_flags() -> set[str]:
    info = Path("/proc/cpuinfo")
    if not info.exists():
        pytest.skip("no /proc/cpuinfo")
    for line in info.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    pytest.skip("no CPU flags in /proc/cpuinfo")


def test_fast_bfloat16_follows_the_cpu_flags():
    """oneDNN has bfloat16 kernels on AVX-512 BF16 / AMX CPUs and none below AVX-512."""
    flags = _cpu_flags()
    if flags & {"avx512_bf16", "amx_bf16"}:
        assert precision.fast_bfloat16() is True
    elif "avx512f" not in flags:
        assert precision.fast_bfloat16() is False
    else:
        pytest.skip("AVX-512 without BF16: oneDNN's emulation, either answer is plausible")


@pytest.mark.parametrize("fast, dtype, bf16", [(True, "bfloat16", True), (False, "float32", False)])
def test_auto_resolves_by_the_cpu(monkeypatch, fast, dtype, bf16):
    monkeypatch.setattr(precision, "fast_bfloat16", lambda: fast)
    assert precision.resolve_dtype("auto") == dtype
    assert precision.resolve_bf16("auto") is bf16
    # explicit settings are kept whatever the CPU
    assert precision.resolve_dtype("bfloat16") == "bfloat16"
    assert precision.resolve_dtype("float32") == "float32"
    assert precision.resolve_bf16(True) is True and precision.resolve_bf16(False) is False
    # the engine and the trainer resolve their `auto` when they are built
    assert HFEngine("smollm2-135m-instruct", dtype="auto").dtype == dtype
    trainer = PolicyGradientTrainer(model=tiny_llama(), **yaml_keys(bf16="auto"))
    assert trainer.keys["bf16"] is bf16


def test_defaults_say_auto_except_in_deterministic_mode():
    """The engine defaults to auto (float32 in deterministic mode: exact batch invariance), and
    experiment=learn trains with bf16 autocast only where it is fast."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        assert compose("config").engine.dtype == "auto"
        assert compose("config", overrides=["rollout.deterministic=true"]).engine.dtype == "float32"
        assert compose("config", overrides=["experiment=learn"]).trainer.bf16 == "auto"
    assert OmegaConf.load(CONF / "trainer" / "policy_gradient.yaml").bf16 is False
