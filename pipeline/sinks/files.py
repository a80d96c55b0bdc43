"""Run-dir files: train data per rollout (safetensors + JSON, no pickle) and sample dumps (JSONL).

Train data is stored generically so a custom convert hook's dict round-trips too: a flat list of
numbers becomes one tensor, a list of number lists becomes a flat tensor plus offsets, anything
else goes to the JSON sidecar. `load_train_data(path)` gives back the same dict of lists.
"""

from __future__ import annotations

import json
import os
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pipeline.process.atomic import atomic_write_text, file_mode, make_temp
from pipeline.samples.sample import Sample

__all__ = ["load_train_data", "read_samples", "to_tensors", "write_samples", "write_train_data"]

_FORMAT = "rollout-pipeline/train-data/v1"


def _num_kind(values: list[Any]) -> str | None:
    """'int' / 'float' when every value is a number (bools excluded), else None."""
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        return None
    return "int" if all(isinstance(v, int) for v in values) else "float"


def _encode(key: str, value: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    if isinstance(value, list) and (kind := _num_kind(value)):
        dtype = torch.int64 if kind == "int" else torch.float64
        tensors[key] = torch.tensor(value, dtype=dtype)
        return {"kind": "flat", "dtype": kind}
    if isinstance(value, list) and value and all(isinstance(r, list) for r in value):
        flat = [v for r in value for v in r]
        kind = _num_kind(flat) if flat else "int"
        if kind:
            dtype = torch.int64 if kind == "int" else torch.float64
            tensors[key] = torch.tensor(flat, dtype=dtype)
            tensors[f"{key}.__lengths__"] = torch.tensor([len(r) for r in value], dtype=torch.int64)
            return {"kind": "ragged", "dtype": kind}
    return {"kind": "json", "value": value}


def write_train_data(path: str | os.PathLike[str], data: dict[str, Any], meta: dict[str, Any] | None = None) -> None:
    """Write `data` to `<path>.safetensors` + `<path>.json` (path without suffix), atomically."""
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    keys = {k: _encode(k, v, tensors) for k, v in data.items()}
    st = base.with_suffix(".safetensors")
    fd, tmp = make_temp(base.parent, prefix=f".{st.name}.")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"format": _FORMAT})
        os.chmod(tmp, file_mode())  # save_file writes the file anew, with mode 0600
        os.replace(tmp, st)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sidecar = {"format": _FORMAT, "keys": keys, "meta": meta or {}}
    atomic_write_text(base.with_suffix(".json"), json.dumps(sidecar, default=_json_default))


def load_train_data(path: str | os.PathLike[str], as_tensors: bool = False, pad_token_id: int = 0) -> dict[str, Any]:
    """Load train data written by `write_train_data`: `path` may end in .safetensors, .json or
    neither. Returns the dict of lists as it was converted (no pickle involved), or with
    `as_tensors` the right-padded trainer tensors of `to_tensors`."""
    data = _load_lists(path)
    if as_tensors:
        return to_tensors(data, pad_token_id=pad_token_id)
    return data


def _pad(rows: list[list[Any]], value: Any, dtype: torch.dtype) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def to_tensors(train_data: dict[str, Any], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded tensors for a trainer: tokens/attention_mask [B, T], loss_masks and
    rollout_log_probs [B, R] (response positions), and 1-D per-sample columns."""
    out: dict[str, torch.Tensor] = {
        "tokens": _pad(train_data["tokens"], pad_token_id, torch.long),
        "attention_mask": _pad([[1] * len(t) for t in train_data["tokens"]], 0, torch.long),
        "loss_masks": _pad(train_data["loss_masks"], 0, torch.long),
    }
    for key, dtype in (("response_lengths", torch.long), ("truncated", torch.long),
                       ("rollout_ids", torch.long), ("rollout_mask_sums", torch.long),
                       ("rewards", torch.float32), ("raw_reward", torch.float32)):
        if key in train_data:
            out[key] = torch.tensor(train_data[key], dtype=dtype)
    if "sample_indices" in train_data and all(i is not None for i in train_data["sample_indices"]):
        out["sample_indices"] = torch.tensor(train_data["sample_indices"], dtype=torch.long)
    if "rollout_log_probs" in train_data:
        out["rollout_log_probs"] = _pad(train_data["rollout_log_probs"], 0.0, torch.float32)
    return out


def _load_lists(path: str | os.PathLike[str]) -> dict[str, Any]:
    base = Path(path)
    if base.suffix in (".safetensors", ".json"):
        base = base.with_suffix("")
    side_path = base.with_suffix(".json")
    try:
        sidecar = json.loads(side_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{side_path}: no train data here (expected <run>/train_data/rollout_<id>.json)") from None
    if sidecar.get("format") != _FORMAT:
        raise ValueError(f"{side_path}: format {sidecar.get('format')!r}, expected {_FORMAT!r}")
    tensors = load_file(str(base.with_suffix(".safetensors")))
    out: dict[str, Any] = {}
    for key, spec in sidecar["keys"].items():
        if spec["kind"] == "json":
            out[key] = spec["value"]
        elif spec["kind"] == "flat":
            out[key] = tensors[key].tolist()
        else:
            flat = tensors[key].tolist() if key in tensors else []
            rows, pos = [], 0
            for n in tensors[f"{key}.__lengths__"].tolist():
                rows.append(flat[pos : pos + n])
                pos += n
            out[key] = rows
    return out


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return obj.to_dict()
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def write_samples(path: str | os.PathLike[str], samples: list[Any]) -> None:
    """Dump `Sample.to_dict()` per line to `path` (JSONL), atomically."""
    lines = []
    for s in samples:
        try:
            lines.append(json.dumps(s.to_dict(), default=_json_default, ensure_ascii=False))
        except TypeError as exc:
            raise TypeError(f"{path}: sample {getattr(s, 'index', '?')} is not JSON-serialisable: {exc}") from exc
    atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))


def read_samples(path: str | os.PathLike[str]) -> list[Any]:
    """Read a sample dump back into `Sample`s (JSON only)."""

    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(Sample.from_dict(json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a sample dump line: {exc}") from exc
    return out
