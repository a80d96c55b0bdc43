"""Pre-flight checks of the engine (called by `validate`): its device settings, and a trainer
needs an engine that can follow it.

`engine_device_problems`: the hf and ray engines' `engine.device` is one of auto / cpu / cuda,
`cuda` only where a GPU is visible (counted without importing torch, `visible_gpus`; a ray
engine joining a cluster at `engine.address` is judged by the cluster's GPUs when it starts), and
the hf engine's `engine.colocate` is true or false.

With a trainer configured (any `trainer` node other than `trainer=none`), the engine named by
`engine._target_` must take weights: `follow_trainer_problem` of `pipeline.engines.base` asks the
engine class (hf, ray, scripted: always; sglang: with `engine.weight_sync_dir`; openai: only a
LoRA trainer with `engine.lora_name`). A rollout function that brings no engine (`engine` unset)
is not checked: the trainer's sync is then the plugin's business.
"""

from __future__ import annotations

from typing import Any

from pipeline.cluster.devices import DEVICES, HF_ENGINE, DeviceError, resolve_device, visible_gpus
from pipeline.engines.base import follow_trainer_problem
from pipeline.config.plugins import allowed_targets, load_object

__all__ = ["engine_device_problems", "trainer_engine_problems", "has_trainer", "trainer_uses_lora"]

RAY_ENGINE = "pipeline.engines.ray_pool.RayEngine"


def engine_device_problems(cfg: dict[str, Any]) -> list[str]:
    """Messages naming `engine.device` / `engine.colocate`, the value and what is expected, for the
    hf and ray engines (other engines have no such keys)."""
    engine = cfg.get("engine")
    target = engine.get("_target_") if isinstance(engine, dict) else None
    if target not in (HF_ENGINE, RAY_ENGINE):
        return []
    out: list[str] = []
    device = engine.get("device")
    if device not in DEVICES:
        out.append(f"engine.device: expected one of {list(DEVICES)} (auto: CUDA when there is a GPU), got {device!r}")
    elif device == "cuda" and not (target == RAY_ENGINE and engine.get("address")):
        try:
            resolve_device(device, "engine.device", visible_gpus())
        except DeviceError as exc:
            out.append(str(exc))
    if target == HF_ENGINE and not isinstance(engine.get("colocate"), bool):
        out.append(f"engine.colocate: expected true or false (true: the engine shares cuda:0 with the trainer's "
                   f"worker 0; false: it takes the last GPU for itself), got {engine.get('colocate')!r}")
    return out


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
