"""Every engine and reward option builds from its YAML without loading a model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.config.plugins import build
from pipeline.engines.base import Engine

CONF = Path(__file__).resolve().parents[2] / "conf"


def _compose(overrides: list[str]):  # type: ignore[no-untyped-def]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=overrides)


@pytest.mark.parametrize("name,cls", [
    ("hf", "HFEngine"), ("ray", "RayEngine"), ("openai", "OpenAIEngine"), ("sglang", "SGLangEngine"),
])
def test_engine_builds_lazily(name: str, cls: str) -> None:
    cfg = _compose([f"engine={name}"])
    engine = build(cfg.engine, where="engine")
    try:
        assert type(engine).__name__ == cls and isinstance(engine, Engine)
        assert getattr(engine, "model", None) is None  # nothing loaded
        assert getattr(engine, "_slots", []) == []      # no Ray actors started
    finally:
        engine.close()
    if name in ("openai", "sglang"):
        assert asyncio.run(engine.health()) is False  # closed


def test_hf_engine_takes_the_run_keys() -> None:
    cfg = _compose(["engine=hf", "hf_checkpoint=/some/folder", "seed=7", "engine.num_threads=1"])
    engine = build(cfg.engine, where="engine")
    assert (engine.hf_checkpoint, engine.num_threads) == ("/some/folder", 1)
    engine.close()


@pytest.mark.parametrize("name,rm_type", [("math", "math"), ("boxed_math", "boxed_math"),
                                          ("remote", "remote")])
def test_reward_options_build(name: str, rm_type: str) -> None:
    reward = build(_compose([f"reward={name}"]).reward, where="reward")
    assert type(reward).__name__ == "RewardDispatcher" and reward.rm_type == rm_type


def test_custom_reward_needs_a_path() -> None:
    cfg = _compose(["reward=custom", "reward.custom_rm_path=pipeline.rewards.math.grade"])
    assert build(cfg.reward, where="reward").custom_rm_path == "pipeline.rewards.math.grade"
    with pytest.raises(Exception, match="custom_rm_path"):
        build(_compose(["reward=custom"]).reward, where="reward")
