"""A worker's side of the trainer's weights and state: the full weights gathered for the engine,
and checkpoints with `torch.distributed.checkpoint` (DCP).

- `full_weights(model, lora)`: every worker takes part; rank 0 gets the whole state under HF
  names on the CPU (`get_model_state_dict` with full_state_dict and cpu_offload: one parameter
  gathered at a time, so the peak on rank 0 is its shard plus the full float32 copy it returns),
  LoRA merged into the base weights (W + B A * scaling, as peft's merge), the others get None.
- `adapter_weights(model)`: rank 0 gets the LoRA adapter tensors under peft's saved names.
- `save_shards(model, optimizer, folder)`: each worker writes its shard of the trainable
  parameters and their AdamW state into `folder` (DCP's files; rank 0 adds the metadata);
  `load_shards` reads them back in any number of workers (DCP reshards: 2 -> 1, 1 -> 2).
- `load_full_state(model, optimizer, saved)`: a single-process trainer's state
  (`pipeline.train.state.read_state`) into a sharded or replicated model (every worker reads
  the whole files and keeps its part).
On one process (no process group) the same DCP calls read a sharded checkpoint into a plain
model: the in-process trainer resumes a distributed run's state with `load_shards` too.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeline.train.state import read_meta, restore_rng

__all__ = ["adapter_weights", "full_weights", "is_sharded_state", "load_full_state", "load_sharded", "load_shards",
           "merge_lora", "save_shards"]


def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kw)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def merge_lora(state: dict[str, torch.Tensor], model: Any) -> dict[str, torch.Tensor]:
    """A peft model's full state (peft names) -> HF names with each LoRA delta merged into its
    base weight (scaling and fan_in_fan_out read from the model's LoRA layers)."""
    from peft.tuners.lora import LoraLayer

    prefix = "base_model.model."
    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    out: dict[str, torch.Tensor] = {}
    for name, module in layers.items():
        adapter = module.active_adapters[0]
        a = state[f"{name}.lora_A.{adapter}.weight"].float()
        b = state[f"{name}.lora_B.{adapter}.weight"].float()
        delta = (b @ a) * float(module.scaling[adapter])
        if getattr(module, "fan_in_fan_out", False):
            delta = delta.T
        base = state[f"{name}.base_layer.weight"]
        out[f"{name}.weight".removeprefix(prefix)] = (base.float() + delta).to(base.dtype)
    for key, tensor in state.items():
        if "lora_" in key:
            continue
        out.setdefault(key.replace(".base_layer.", ".").removeprefix(prefix), tensor)
    return out


def full_weights(model: Any, lora: bool) -> dict[str, torch.Tensor] | None:
    """The whole policy under HF names on rank 0 (LoRA merged); None on the other ranks."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))
    if _rank() != 0:
        return None
    return merge_lora(state, model) if lora else dict(state)


def adapter_weights(model: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """(adapter tensors under peft's file names, adapter_config as a dict) on rank 0; None elsewhere."""
    from peft import get_peft_model_state_dict
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))
    if _rank() != 0:
        return None
    adapter = get_peft_model_state_dict(model, state_dict=state)
    return {k: v.contiguous() for k, v in adapter.items()}, model.peft_config["default"].to_dict()


def is_sharded_state(folder: str | Path) -> bool:
    """Whether `folder` holds a DCP checkpoint (its `.metadata` file)."""
    return (Path(folder) / ".metadata").is_file()


def _state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(ignore_frozen_params=True))
    return {"model": model_sd, "optim": optim_sd}


def save_shards(model: Any, optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    """This worker's shard of the trainable parameters and their optimizer state into `folder`."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(model, optimizer), checkpoint_id=str(folder))


def load_shards(model: Any, optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    """Read `save_shards`' files into this worker's (or this process's) model and optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state(model, optimizer)
    with warnings.catch_warnings():
        # in one process (the one-process trainer resuming a distributed run) DCP says it
        # assumes as much: that is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        try:
            dcp.load(state, checkpoint_id=str(folder))
        except BaseException as exc:  # DCP's CheckpointException (a BaseException) wraps each rank's error
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            causes = [*(str(failure[0]) for failure in getattr(exc, "failures", {}).values()), str(exc)]
            missing = next((c for c in causes if "Missing key in checkpoint" in c), None)
            if missing is None:
                raise
            raise ValueError(f"{folder}: the saved trainer state does not match the model ({missing.strip()}); "
                             f"another model or LoRA setting (trainer.lora_rank)?") from None
    # frozen parameters (a LoRA base) are not in the checkpoint: they stay as loaded, hence not
    # strict (dcp.load itself refuses a trainable parameter the checkpoint lacks)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=_options(ignore_frozen_params=True, strict=False))


def load_full_state(model: Any, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """A single-process trainer state (`read_state`'s parts) into this worker's model and
    optimizer, each worker keeping its part."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    names = {id(p): n for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    missing = sorted(trainable - set(saved["policy"]))
    unknown = sorted(set(saved["policy"]) - set(names.values()))
    if missing or unknown:
        raise ValueError(f"the saved policy does not match the model: missing {missing[:5]}, unknown {unknown[:5]} "
                         f"(another model or LoRA setting?)")
    # (no list -> tuple for the betas: set_state_dict rebuilds the groups, and lists they stay)
    groups = [{**hyper, "params": [names[id(p)] for p in group["params"]]}
              for group, hyper in zip(optimizer.param_groups, saved["param_groups"])]
    optim_sd = {"state": {n: dict(s) for n, s in saved["optimizer"].items() if s}, "param_groups": groups}
    set_state_dict(model, optimizer, model_state_dict=dict(saved["policy"]), optim_state_dict=optim_sd,
                   options=_options(full_state_dict=True, strict=False))


def load_sharded(folder: str | Path, model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A distributed trainer's folder into one process: the shards (resharded to whole
    tensors), rank 0's random streams; returns the counters (weight_version, optimizer_step)."""
    meta = read_meta(folder)
    load_shards(model, optimizer, folder)
    if meta.get("rng"):
        restore_rng(meta["rng"][0])
    return {"weight_version": int(meta["weight_version"]), "optimizer_step": int(meta["optimizer_step"])}
