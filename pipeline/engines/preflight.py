"""Pre-flight check (called by `validate`): a trainer needs an engine that can follow it.

With a trainer configured (any `trainer` node other than `trainer=none`), the engine named by
`engine._target_` must take weights: `follow_trainer_problem` of `pipeline.engines.base` asks the
engine class (hf, ray, scripted: always; sglang: with `engine.weight_sync_dir`; openai: only a
LoRA trainer with `engine.lora_name`). A rollout function that brings no engine (`engine` unset)
is not checked: the trainer's sync is then the plugin's business.
"""

from __future__ import annotations

from typing import Any

from pipeline.engines.base import follow_trainer_problem
from pipeline.plugins import allowed_targets, load_object

__all__ = ["trainer_engine_problems", "has_trainer", "trainer_uses_lora"]


def has_trainer(cfg: dict[str, Any]) -> bool:
    """True when the config trains the policy (a `trainer` node naming a `_target_` or `path`)."""
    node = cfg.get("trainer")
    return isinstance(node, dict) and (node.get("_target_") or node.get("path")) is not None


def trainer_uses_lora(trainer: dict[str, Any]) -> bool:
    """Whether the trainer node trains a LoRA adapter (`lora_rank > 0`, as trainer=policy_gradient
    says it; `lora: true`, `use_lora: true` or a `lora:` mapping that is not `enabled: false`)."""
    rank = trainer.get("lora_rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return rank > 0
    value = trainer.get("lora", trainer.get("use_lora"))
    if isinstance(value, dict):
        return bool(value) and value.get("enabled", True) is not False
    return bool(value)


def trainer_engine_problems(cfg: dict[str, Any]) -> list[str]:
    """A message naming the engine and what to change when it cannot follow the trainer."""
    engine = cfg.get("engine")
    if not has_trainer(cfg) or not isinstance(engine, dict) or not isinstance(engine.get("_target_"), str):
        return []
    try:
        cls = load_object(engine["_target_"], allowed_targets(cfg), "engine._target_")
    except Exception:  # noqa: BLE001 - the allowlist / import rules report it on their own
        return []
    problem = follow_trainer_problem(cls, engine, trainer_uses_lora(cfg["trainer"]))
    return [f"trainer: {problem}"] if problem else []
