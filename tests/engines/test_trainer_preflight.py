"""Pre-flight: a trainer with an engine that cannot follow it is refused with a clear message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pipeline.config.args import ConfigError, validate
from pipeline.engines.preflight import has_trainer, trainer_engine_problems, trainer_uses_lora

pytestmark = pytest.mark.timeout(60)

CONF = Path(__file__).resolve().parents[2] / "conf"
# any importable trainer: the check reads only that one is configured (and whether it is LoRA)
# a trainer node as the pre-flight check sees it (trainer=function's class; the check reads only
# that the node names a target, and its LoRA keys)
TRAINER = {"_target_": "pipeline.train.function.FunctionTrainer", "path": "pipeline.stages.log.rollout_metrics"}


def compose_cfg(tmp: Path, *overrides: str) -> Any:
    base = [f"paths.output_dir={tmp}/out", f"paths.cache_dir={tmp}/cache", "data_source.apply_chat_template=false"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=base + list(overrides))


def engine_node(name: str, **over: Any) -> dict[str, Any]:
    node = OmegaConf.to_container(OmegaConf.load(CONF / "engine" / f"{name}.yaml"))
    node.update(over)
    return node


@pytest.mark.parametrize("engine", ["hf", "ray", "scripted"])
def test_engines_that_take_full_weights_pass(engine: str) -> None:
    assert trainer_engine_problems({"trainer": TRAINER, "engine": engine_node(engine)}) == []


def test_sglang_needs_a_weight_sync_dir() -> None:
    [msg] = trainer_engine_problems({"trainer": TRAINER, "engine": engine_node("sglang")})
    assert msg.startswith("trainer: engine=sglang") and "set engine.weight_sync_dir" in msg
    assert trainer_engine_problems({"trainer": TRAINER, "engine": engine_node("sglang", weight_sync_dir="/s")}) == []


def test_openai_follows_only_a_lora_trainer_with_lora_name() -> None:
    [msg] = trainer_engine_problems({"trainer": TRAINER, "engine": engine_node("openai")})
    assert "engine=openai cannot follow a trainer" in msg and "trainer=none" in msg
    lora = {**TRAINER, "lora": {"r": 8}}
    [msg] = trainer_engine_problems({"trainer": lora, "engine": engine_node("openai")})
    assert "set engine.lora_name" in msg
    assert trainer_engine_problems({"trainer": lora, "engine": engine_node("openai", lora_name="p")}) == []
    full = {**TRAINER, "lora": {"enabled": False, "r": 8}}
    assert trainer_engine_problems({"trainer": full, "engine": engine_node("openai", lora_name="p")})


def test_no_trainer_means_no_check_and_lora_detection() -> None:
    for trainer in (None, {"_target_": None}, {"path": None}, "none"):
        assert not has_trainer({"trainer": trainer})
        assert trainer_engine_problems({"trainer": trainer, "engine": engine_node("openai")}) == []
    assert [trainer_uses_lora(t) for t in ({}, {"lora": True}, {"use_lora": True}, {"lora": {}},
                                           {"lora": {"enabled": False}}, {"lora": {"r": 4}})] == \
        [False, True, True, False, False, True]
    # trainer=policy_gradient says it with lora_rank (0: full fine-tuning)
    assert [trainer_uses_lora({"lora_rank": r}) for r in (0, 16)] == [False, True]


def test_validate_refuses_openai_with_a_trainer_and_passes_hf(tmp_path: Path) -> None:
    validate(compose_cfg(tmp_path, "engine=openai"))  # no trainer: fine
    with pytest.raises(ConfigError, match="trainer: engine=openai cannot follow a trainer"):
        validate(compose_cfg(tmp_path, "engine=openai", "trainer=policy_gradient"))
    with pytest.raises(ConfigError, match="engine=openai follows a LoRA trainer only"):
        validate(compose_cfg(tmp_path, "engine=openai", "trainer=policy_gradient", "trainer.lora_rank=8"))
    validate(compose_cfg(tmp_path, "trainer=policy_gradient"))
