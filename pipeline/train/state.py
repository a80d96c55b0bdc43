"""Trainer state on disk: safetensors + JSON, never pickle, written atomically as one folder.

`<dir>/policy.safetensors`   the trainable parameters (the whole model, or the LoRA adapters),
                             under their `named_parameters` names
`<dir>/optimizer.safetensors` AdamW's per-parameter tensors as `<param name>/<state key>`
                             (exp_avg, exp_avg_sq, step) and the torch RNG state as `rng/torch`
`<dir>/trainer_state.json`   weight version, optimizer step, hyper-parameters of each param
                             group, Python and numpy RNG states, format version
The folder is written under a temp name beside `<dir>` and renamed into place
(`pipeline.process.atomic.atomic_dir`: the previous folder, if any, goes only once the new one is complete).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from pipeline.process.atomic import atomic_dir, atomic_write_text

__all__ = ["FORMAT_VERSION", "load_state", "read_meta", "read_state", "restore_rng", "rng_state", "save_state", "seed_rngs"]

FORMAT_VERSION = 1


def seed_rngs(seed: int) -> None:
    """Seed the process-wide RNGs whose states `save_state` saves (torch, random, numpy)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _param_names(model: Any, optimizer: torch.optim.Optimizer) -> list[str]:
    """Names of the optimizer's parameters, in its order."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for group in optimizer.param_groups for p in group["params"]]


def save_state(directory: str | os.PathLike[str], model: Any, optimizer: torch.optim.Optimizer,
               counters: dict[str, Any]) -> None:
    """Write the trainer state folder `directory` atomically (module docstring)."""
    with atomic_dir(directory) as tmp:
        policy = {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}
        save_file(policy, str(tmp / "policy.safetensors"))
        names = _param_names(model, optimizer)
        tensors: dict[str, torch.Tensor] = {"rng/torch": torch.get_rng_state()}
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for name, p in zip(names, params):
            for key, value in optimizer.state.get(p, {}).items():
                tensors[f"{name}/{key}"] = torch.as_tensor(value).detach().contiguous()
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        np_state = np.random.get_state()
        meta = {
            "format_version": FORMAT_VERSION,
            **counters,
            "param_groups": _jsonable(groups),
            "rng": {"python": _jsonable(random.getstate()),
                    "numpy": [np_state[0], np_state[1].tolist(), *map(_jsonable, np_state[2:])]},
        }
        atomic_write_text(tmp / "trainer_state.json", json.dumps(meta))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """A trainer state folder's `trainer_state.json` (any layout), its format version checked."""
    meta_path = Path(directory) / "trainer_state.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{Path(directory)}: no trainer state (trainer_state.json missing)")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{meta_path}: trainer state format {meta.get('format_version')}, expected {FORMAT_VERSION}")
    return meta


def read_state(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """What `save_state` wrote, as plain parts: "policy" (name -> tensor), "optimizer" (name ->
    {state key -> tensor}), "param_groups" (hyper-parameters per group), "rng" (`rng_state`'s
    form), "counters" (weight_version, optimizer_step, ...)."""
    folder = Path(directory)
    meta = read_meta(folder)
    tensors = load_file(str(folder / "optimizer.safetensors"))
    optimizer: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        name, _, state_key = key.rpartition("/")  # a parameter name may hold a "/"; a state key does not
        if name != "rng":
            optimizer.setdefault(name, {})[state_key] = t
    return {"policy": load_file(str(folder / "policy.safetensors")), "optimizer": optimizer,
            "param_groups": meta["param_groups"],
            "rng": {"torch": tensors["rng/torch"].tolist(), **meta["rng"]},
            "counters": {k: v for k, v in meta.items() if k not in ("param_groups", "rng", "format_version")}}


def load_state(directory: str | os.PathLike[str], model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load a folder `save_state` wrote into `model` and `optimizer`; restores the RNG states;
    returns the counters (weight_version, optimizer_step, ...)."""
    folder = Path(directory)
    saved = read_state(folder)
    policy = saved["policy"]
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in policy]
    unknown = [n for n in policy if n not in params]
    if missing or unknown:
        raise ValueError(f"{folder}/policy.safetensors does not match the model: missing {missing[:5]}, "
                         f"unknown {unknown[:5]} (another model or LoRA setting?)")
    with torch.no_grad():
        for name, tensor in policy.items():
            params[name].copy_(tensor)
    names = _param_names(model, optimizer)
    opt_params = [p for g in optimizer.param_groups for p in g["params"]]
    optimizer.state.clear()
    for name, p in zip(names, opt_params):
        if saved["optimizer"].get(name):
            optimizer.state[p] = saved["optimizer"][name]
    for group, groups in zip(optimizer.param_groups, saved["param_groups"]):
        group.update({k: tuple(v) if isinstance(v, list) else v for k, v in groups.items()})
    restore_rng(saved["rng"])
    return saved["counters"]


def rng_state() -> dict[str, Any]:
    """This process's torch (CPU, and CUDA where initialised), Python and numpy RNG states, as JSON-able data."""
    np_state = np.random.get_state()
    out: dict[str, Any] = {"torch": torch.get_rng_state().tolist(), "python": _jsonable(random.getstate()),
                           "numpy": [np_state[0], np_state[1].tolist(), *map(_jsonable, np_state[2:])]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state().tolist()
    return out


def restore_rng(state: dict[str, Any]) -> None:
    """Set the RNG states `rng_state` gave (the CUDA one where it has one and CUDA is here)."""
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    random.setstate(_tuples(state["python"]))
    np_rng = state["numpy"]
    np.random.set_state((np_rng[0], np.asarray(np_rng[1], dtype=np.uint32), *np_rng[2:]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8))


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return value


def _tuples(value: Any) -> Any:
    """JSON lists back to the nested tuples `random.setstate` wants."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value
