"""Helpers behind the engines' `update_weights`: in-place copies, per-token versions, HF folders.

- `copy_into_model`: copy a (partial) state dict into a loaded model's tensors in place, after
  checking every name and shape first (nothing is copied when one is wrong).
- `versions_per_token`: expand `(first output index, version)` marks into one version per token.
- `save_hf_folder`: write a state dict as a Hugging Face folder (`model.safetensors` plus the
  base checkpoint's config files) atomically: a temp folder renamed into place, older versions
  pruned. This is what a server that loads weights from disk (SGLang) is pointed at.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch

from pipeline.process.atomic import follow_umask, prune_numbered_dirs
from pipeline.engines.base import check_update

__all__ = ["as_arrays", "as_tensors", "copy_into_model", "versions_per_token", "save_hf_folder", "CONFIG_FILES"]

logger = logging.getLogger(__name__)

# files copied from the base checkpoint so the folder is a complete HF model folder
CONFIG_FILES = ("config.json", "generation_config.json")
_VERSION = re.compile(r"v(\d+)")


def as_arrays(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """`state` for another process through Ray's object store: numpy arrays where the dtype has
    one (Ray stores those out of band and hands readers zero-copy views; a pickled torch tensor
    costs a copy each way, seconds for a 135M model), tensors otherwise (bfloat16)."""
    out: dict[str, Any] = {}
    for name, t in state.items():
        t = t.detach()
        out[name] = t.contiguous().numpy() if t.device.type == "cpu" and t.dtype != torch.bfloat16 else t
    return out


def as_tensors(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The inverse of `as_arrays`: tensors sharing the arrays' memory (read-only views from the
    object store: fine for `copy_into_model`, which only reads them)."""
    import numpy as np

    out: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, value in state.items():
            out[name] = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    return out


def copy_into_model(model: Any, state: Mapping[str, torch.Tensor], version: int, at: int) -> int:
    """Copy `state` into `model`'s parameters and buffers in place (no_grad, dtype cast); returns
    the number of tensors copied. Raises ValueError (copying nothing) on an unknown name, a
    shape mismatch or a version that does not move past `at`."""
    current = model.state_dict()  # tensors sharing storage with the parameters
    check_update(current, state, version, at)
    with torch.no_grad():
        for name, tensor in state.items():
            current[name].copy_(tensor.detach().to(device=current[name].device))
    return len(state)


def versions_per_token(marks: list[tuple[int, int]], n: int) -> list[int]:
    """One version per output token from `(first index, version)` marks in index order."""
    out: list[int] = []
    for i, (start, version) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else n
        out.extend([version] * max(0, min(end, n) - start))
    return out


def save_hf_folder(state: Mapping[str, torch.Tensor], base_checkpoint: str | None, root: str | os.PathLike[str],
                   version: int, keep: int = 2) -> Path:
    """Write `state` as `<root>/v<version>/model.safetensors` (+ the base checkpoint's config
    files) atomically and prune all but the newest `keep` version folders; returns the folder."""
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"v{version}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".v{version}."))
    try:
        seen: set[int] = set()
        tensors: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():  # tied weights share storage: safetensors wants copies
            t = tensor.detach().cpu().contiguous()
            ptr = t.untyped_storage().data_ptr()
            tensors[name] = t.clone() if ptr in seen else t
            seen.add(ptr)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if base_checkpoint is not None:
            for name in CONFIG_FILES:
                src = Path(base_checkpoint) / name
                if src.is_file():
                    shutil.copyfile(src, tmp / name)
        follow_umask(tmp)  # safetensors writes 0600, mkdtemp makes 0700
        if final.exists():  # a rerun of the same version (resume): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in prune_numbered_dirs(root, _VERSION, keep):
        logger.debug("weight sync: removed %s", old)
    return final

