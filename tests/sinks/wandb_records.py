"""Read an offline wandb run file (`run-<id>.wandb`) with wandb's own protobuf record classes.

wandb >= 0.2x dropped its Python `wandb.sdk.internal.datastore` reader (the store is written by
the Go core now), so this is that reader's LevelDB-log framing, ~30 lines, checksums verified;
the records themselves are parsed by `wandb.proto.wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any, Iterator

from wandb.proto import wandb_internal_pb2 as pb

_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def scan(path: str | Path) -> Iterator[Any]:
    """Every `pb.Record` in the file, in write order."""
    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:_HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"{path}: not a wandb run file"
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block tail padding
            pos += left
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if length == 0 and kind == 0:
            break
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == checksum, f"{path}@{pos}: bad crc"
        pos += _HEADER + length
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def history(path: str | Path) -> list[dict[str, Any]]:
    """The logged history rows: `{"_step": ..., key: value, ...}`."""
    rows = []
    for record in scan(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    return rows


def run_info(path: str | Path) -> dict[str, Any]:
    """id, group, display name, config keys of the run record."""
    for record in scan(path):
        if record.WhichOneof("record_type") == "run":
            r = record.run
            config = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.config.update}
            return {"id": r.run_id, "group": r.run_group, "name": r.display_name, "config": config}
    raise AssertionError(f"{path}: no run record")
