"""Lossless, atomic data-source checkpoints (docs/contracts.md §5) — JSON plus raw arrays, never pickle.

A checkpoint file is one header line `{"magic", "version", "sha256", "size", "json_size",
"arrays"}` followed by the payload the header describes: the JSON state (one line), then one
binary section holding every numpy array of the state (the buffer's columns) as raw
little-endian bytes, 8-byte aligned. `arrays` lists, per array, where it sits in the JSON
(a key path), its dtype, shape, offset and size, so loading is `np.frombuffer` (no pickle).
The file is written to a temp file in the same folder, fsynced, renamed over
`<dir>/rollout_<id>.json`, and the folder is fsynced: a crash leaves either the old file or the
new one. A truncated or altered file fails the size/sha256 check on load. Version-1 files
(pure JSON, base64 arrays), version-2 files (no `fill` / `same_rows` array encodings) and
version-3 files (the Sample before slime's later fields, which load with their defaults) still
load. Buffered samples are encoded by `sample_codec`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.errors import CheckpointError
from pipeline.data.sample_codec import decode_groups, encode_groups

__all__ = [
    "encode_groups", "decode_groups", "write_checkpoint", "read_checkpoint", "list_checkpoints",
    "prune_checkpoints", "checkpoint_path", "read_slime_state", "diff_fingerprints",
]

logger = logging.getLogger(__name__)

MAGIC = "rollout-pipeline-checkpoint"
VERSION = 4  # 4: slime's full Sample (top-p / teacher arrays, spec / prefix-cache records)
_READABLE = (1, 2, 3, 4)  # 3: loss masks of all 1s and columns of identical rows are stored once
_NAME = re.compile(r"^rollout_(-?\d+)\.json$")


def checkpoint_path(directory: str | os.PathLike, rollout_id: int) -> Path:
    """`<directory>/rollout_<id>.json`."""
    return Path(directory) / f"rollout_{int(rollout_id)}.json"


def _write_bytes(f: Any, data: bytes) -> None:
    """Write in 1 MiB chunks (a seam the crash test slows down)."""
    view = memoryview(data)
    for start in range(0, len(view), 1 << 20):
        f.write(view[start:start + (1 << 20)])


def _take_arrays(node: dict[str, Any], path: list[str], found: list[tuple[list[str], np.ndarray]]) -> dict[str, Any]:
    """A copy of the dict tree `node` with every numpy array moved out into `found`."""
    out = {}
    for key, value in node.items():
        if isinstance(value, np.ndarray):
            found.append((path + [key], value))
            out[key] = None
        elif isinstance(value, dict):
            out[key] = _take_arrays(value, path + [key], found)
        else:
            out[key] = value
    return out


def _payload(path: Path, state: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """The payload bytes (JSON line + array section) and the header fields describing it."""
    found: list[tuple[list[str], np.ndarray]] = []
    state = _take_arrays(state, [], found)
    try:
        text = json.dumps(state, separators=(",", ":")).encode() + b"\n"
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: the data-source state is not JSON-serialisable ({exc})") from exc
    parts, arrays, offset = [text], [], len(text)
    for key_path, arr in found:
        pad = -offset % 8
        if pad:
            parts.append(b"\0" * pad)
            offset += pad
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        parts.append(arr.tobytes())
        arrays.append({"path": key_path, "dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset,
                       "nbytes": arr.nbytes})
        offset += arr.nbytes
    return b"".join(parts), {"json_size": len(text), "arrays": arrays}


def write_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write `state` atomically with a size + sha256 header (temp + fsync + rename + dir fsync).

    `state` is JSON-able data in which dict values may also be numpy arrays (stored raw).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload, layout = _payload(path, state)
    header = json.dumps({"magic": MAGIC, "version": VERSION, "size": len(payload),
                         "sha256": hashlib.sha256(payload).hexdigest(), **layout}).encode() + b"\n"
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    for stale in path.parent.glob(".rollout_*.json.*.tmp"):  # left by a killed writer
        stale.unlink(missing_ok=True)
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
    """Read and verify one checkpoint; CheckpointError names the file and what is wrong.

    Arrays come back as read-only numpy arrays at the places they were written from.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint ({exc})") from exc
    end = raw.find(b"\n")  # the header line (no copy of the payload)
    head, sep = (raw[:end], True) if end >= 0 else (raw, False)
    try:
        header = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError):
        header = None
    if not sep or not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise CheckpointError(f"{path}: not a rollout-pipeline checkpoint (bad header)")
    if header.get("version") not in _READABLE:
        raise CheckpointError(f"{path}: checkpoint version {header.get('version')}, expected {VERSION}")
    payload = memoryview(raw)[len(head) + 1:]
    if len(payload) != header.get("size"):
        raise CheckpointError(
            f"{path}: truncated checkpoint ({len(payload)} payload bytes, header says {header.get('size')})")
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise CheckpointError(f"{path}: checksum mismatch (the file was altered or corrupted)")
    try:
        state = json.loads(bytes(payload[:header.get("json_size", len(payload))]))
        for entry in header.get("arrays", []):
            node = state
            for key in entry["path"][:-1]:
                node = node[key]
            dtype, count = np.dtype(entry["dtype"]), int(np.prod(entry["shape"]))
            arr = np.frombuffer(raw, dtype=dtype, count=count, offset=len(head) + 1 + entry["offset"]) \
                if count else np.zeros(0, dtype=dtype)
            node[entry["path"][-1]] = arr.reshape(entry["shape"])
    except (KeyError, TypeError, ValueError) as exc:  # a checksummed file written by other code
        raise CheckpointError(f"{path}: malformed checkpoint layout ({exc})") from exc
    return state


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
