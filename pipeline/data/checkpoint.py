"""Lossless, atomic data-source checkpoints (SPEC §5) — JSON, never pickle.

A checkpoint file is one header line `{"magic", "version", "sha256", "size"}` followed by the
JSON payload the header describes. It is written to a temp file in the same folder, fsynced,
renamed over `<dir>/rollout_<id>.json`, and the folder is fsynced: a crash leaves either the
old file or the new one. A truncated or altered file fails the size/sha256 check on load.

Buffered samples are stored column-wise: the numeric per-token lists (tokens, loss_mask,
rollout_log_probs) as base64 numpy buffers when they are homogeneous ints/floats (else as
plain JSON lists), every other field as one JSON list per field, extra attributes per sample.
"""

from __future__ import annotations

import base64
import dataclasses
import gc
import hashlib
import json
import logging
import os
import re
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.errors import CheckpointError
from pipeline.sample import Sample

__all__ = [
    "encode_groups", "decode_groups", "write_checkpoint", "read_checkpoint", "list_checkpoints",
    "prune_checkpoints", "checkpoint_path", "read_slime_state", "diff_fingerprints",
]

logger = logging.getLogger(__name__)

MAGIC = "rollout-pipeline-checkpoint"
VERSION = 1
_NAME = re.compile(r"^rollout_(-?\d+)\.json$")
_ARRAYS = {"tokens": int, "loss_mask": int, "rollout_log_probs": float}
_FIELDS = tuple(f for f in Sample.__dataclass_fields__ if f not in _ARRAYS)


def _default(name: str) -> Any:
    """A zero-argument factory for the default of Sample field `name` (for foreign samples)."""
    f = Sample.__dataclass_fields__[name]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory
    return lambda: f.default


# ---------------------------------------------------------------------- samples
def _sample_dict(s: Any) -> dict[str, Any]:
    d = dict(s.__dict__) if isinstance(s, Sample) else dict(s.to_dict() if hasattr(s, "to_dict") else vars(s))
    status = d.get("status", Sample.Status.PENDING)
    d["status"] = getattr(status, "value", status)
    return d


def _b64(arr: np.ndarray) -> str:
    return base64.b64encode(arr.tobytes()).decode()


def _smallest_int(arr: np.ndarray) -> np.ndarray:
    if arr.size == 0:
        return arr.astype("<i4")
    lo, hi = int(arr.min()), int(arr.max())
    for dtype in ("<u1", "<i1", "<u2", "<i2", "<u4", "<i4"):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return arr.astype(dtype)
    return arr.astype("<i8")


def _encode_array(values: list[Any], kind: type) -> dict[str, Any] | None:
    """Base64 buffers for a column of `list[number] | None`, or None when not numeric.

    Ints use the smallest integer dtype that holds them; floats use float32 when that is
    exact for every value (log-probs of float32 engines), else float64. Values compare equal
    after a round trip (an int inside a float list comes back as the equal float).
    """
    present = [v for v in values if v is not None]
    if any(type(v) is not list for v in present):
        return None
    flat = list(chain.from_iterable(present))
    try:
        arr = np.array(flat) if flat else np.zeros(0, dtype=np.int64 if kind is int else np.float64)
    except (OverflowError, ValueError):
        return None
    if arr.ndim != 1 or arr.dtype.kind not in ("iu" if kind is int else "iuf"):
        return None
    if kind is int:
        arr = _smallest_int(arr)
    else:
        arr = arr.astype(np.float64)
        f32 = arr.astype("<f4")
        arr = f32 if np.array_equal(f32.astype(np.float64), arr, equal_nan=True) else arr.astype("<f8")
    lengths = _smallest_int(np.fromiter((-1 if v is None else len(v) for v in values), np.int64, len(values)))
    return {"dtype": arr.dtype.str, "lengths": _b64(lengths), "lengths_dtype": lengths.dtype.str,
            "data": _b64(arr)}


def _decode_array(enc: dict[str, Any]) -> list[list[Any] | None]:
    lengths = np.frombuffer(base64.b64decode(enc["lengths"]), dtype=enc["lengths_dtype"]).tolist()
    flat = np.frombuffer(base64.b64decode(enc["data"]), dtype=enc["dtype"]).tolist()
    out: list[list[Any] | None] = []
    pos = 0
    for n in lengths:
        if n < 0:
            out.append(None)
        else:
            out.append(flat[pos:pos + n])
            pos += n
    return out


_SCALARS = (str, int, float, bool, type(None))


def _encode_column(values: list[Any]) -> Any:
    """A field column: one constant, interned strings, or the plain JSON list."""
    if values and type(values[0]) in _SCALARS:
        kinds = set(map(type, values))
        if len(kinds) == 1 and values.count(values[0]) == len(values):
            return {"const": values[0]}
        if kinds == {str}:
            table = {v: i for i, v in enumerate(dict.fromkeys(values))}
            small = _smallest_int(np.fromiter(map(table.__getitem__, values), np.int64, len(values)))
            return {"strings": list(table), "index": _b64(small), "index_dtype": small.dtype.str}
    return {"values": values}


def _decode_column(enc: dict[str, Any], total: int) -> list[Any]:
    if "const" in enc:
        return [enc["const"]] * total
    if "strings" in enc:
        strings = enc["strings"]
        idx = np.frombuffer(base64.b64decode(enc["index"]), dtype=enc["index_dtype"]).tolist()
        return [strings[i] for i in idx]
    return enc["values"]


def encode_groups(groups: list[list[Any]]) -> dict[str, Any]:
    """JSON-able, lossless encoding of groups of samples (ours or slime's)."""
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of small objects: generational GC passes would dominate
    try:
        dicts = [s.__dict__ if type(s) is Sample else _sample_dict(s) for g in groups for s in g]
        out: dict[str, Any] = {"group_sizes": [len(g) for g in groups], "columns": {}, "arrays": {}}
        for name, kind in _ARRAYS.items():
            values = [d.get(name) for d in dicts]
            enc = _encode_array(values, kind)
            if enc is None:
                out["columns"][name] = {"values": values}
            else:
                out["arrays"][name] = enc
        for name in _FIELDS:
            default = _default(name)
            values = [d[name] if name in d else default() for d in dicts]
            if name == "status":
                values = [getattr(v, "value", v) for v in values]
            out["columns"][name] = _encode_column(values)
        n_fields = len(Sample.__dataclass_fields__)
        out["extras"] = [[i, {k: v for k, v in d.items() if k not in Sample.__dataclass_fields__}]
                         for i, d in enumerate(dicts) if len(d) > n_fields or type(groups) is not list]
        out["extras"] = [e for e in out["extras"] if e[1]]
        return out
    finally:
        if gc_was_on:
            gc.enable()


_STATUS = {s.value: s for s in Sample.Status}


def decode_groups(enc: dict[str, Any]) -> list[list[Sample]]:
    """Inverse of `encode_groups`: fresh `Sample` objects, extra attributes restored."""
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        total = sum(enc["group_sizes"])
        columns = {name: _decode_column(col, total) for name, col in enc["columns"].items()}
        for name, arr in enc["arrays"].items():
            columns[name] = _decode_array(arr)
        names = list(columns)
        rows = [dict(zip(names, vals)) for vals in zip(*(columns[n] for n in names))]
        if len(rows) != total:
            raise CheckpointError(f"buffer encoding holds {len(rows)} samples, group sizes say {total}")
        for i, extra in enc["extras"]:
            rows[i].update(extra)
        samples = []
        new = object.__new__
        for d in rows:
            d["status"] = _STATUS[d["status"]]
            s = new(Sample)
            s.__dict__.update(d)
            samples.append(s)
        groups, pos = [], 0
        for size in enc["group_sizes"]:
            groups.append(samples[pos:pos + size])
            pos += size
        return groups
    finally:
        if gc_was_on:
            gc.enable()


# ---------------------------------------------------------------------- files
def checkpoint_path(directory: str | os.PathLike, rollout_id: int) -> Path:
    """`<directory>/rollout_<id>.json`."""
    return Path(directory) / f"rollout_{int(rollout_id)}.json"


def _write_bytes(f: Any, data: bytes) -> None:
    """Write in 1 MiB chunks (a seam the crash test slows down)."""
    view = memoryview(data)
    for start in range(0, len(view), 1 << 20):
        f.write(view[start:start + (1 << 20)])


def write_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write `state` atomically with a size + sha256 header (temp + fsync + rename + dir fsync)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        payload = json.dumps(state, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: the data-source state is not JSON-serialisable ({exc})") from exc
    header = json.dumps({"magic": MAGIC, "version": VERSION, "size": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest()}).encode() + b"\n"
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            _write_bytes(f, header + payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read and verify one checkpoint; CheckpointError names the file and what is wrong."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint ({exc})") from exc
    head, sep, payload = raw.partition(b"\n")
    try:
        header = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError):
        header = None
    if not sep or not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise CheckpointError(f"{path}: not a rollout-pipeline checkpoint (bad header)")
    if header.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {header.get('version')}, expected {VERSION}")
    if len(payload) != header.get("size"):
        raise CheckpointError(
            f"{path}: truncated checkpoint ({len(payload)} payload bytes, header says {header.get('size')})")
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise CheckpointError(f"{path}: checksum mismatch (the file was altered or corrupted)")
    return json.loads(payload)


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """`(rollout_id, path)` of every `rollout_<id>.json` in `directory`, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m[1]), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def prune_checkpoints(directory: str | os.PathLike, keep: int) -> None:
    """Delete all but the `keep` newest checkpoints."""
    for _, p in list_checkpoints(directory)[:-keep]:
        p.unlink(missing_ok=True)


def read_slime_state(path: str | os.PathLike) -> dict[str, Any]:
    """A slime `global_dataset_state_dict_<id>.pt`, read with `torch.load(weights_only=True)`."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types
        raise CheckpointError(f"{path}: cannot read slime data-source state ({exc})") from exc
    need = ("sample_offset", "epoch_id", "sample_group_index", "sample_index")
    if not isinstance(state, dict) or any(k not in state for k in need):
        raise CheckpointError(f"{path}: a slime data-source state needs keys {list(need)}")
    return state


def diff_fingerprints(saved: Any, now: Any, where: str = "") -> list[str]:
    """Human-readable differences between two fingerprints (empty when equal)."""
    if isinstance(saved, dict) and isinstance(now, dict):
        out: list[str] = []
        for key in sorted(set(saved) | set(now), key=str):
            out += diff_fingerprints(saved.get(key), now.get(key), f"{where}.{key}" if where else key)
        return out
    if isinstance(saved, list) and isinstance(now, list) and len(saved) == len(now):
        return [x for i, (a, b) in enumerate(zip(saved, now)) for x in diff_fingerprints(a, b, f"{where}[{i}]")]
    return [] if saved == now else [f"{where}: checkpoint has {saved!r}, now {now!r}"]
