"""Empty labels: the rule for the graders that compare a response with a label, and the pre-flight scan.

The graders of `LABEL_GRADED` (`math`, `deepscaler`, `dapo`, `f1`, each also `boxed_`) need a
label to compare with. A label is empty when it is a string of spaces (`""`, `" "`), a box with
nothing in it (`\\boxed{}`, `\\fbox{ }`), or a list of such labels. slime scores such a row 0 (or
raises, for `dapo` and for a null `f1` label); we refuse the prompt file at pre-flight, naming the
first such line and the count (`empty_labels_in_rows`, called by `preflight.py`), so a bad row
never stops a run mid-way and never trains as a silent 0. Null labels with `label_key` set are
the dataset's (a `DataError` naming the line, or skipped with `skip_bad_rows`).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.data.lengths import ArrayCache
from pipeline.data.readers import open_store, parse_data_path
from pipeline.rewards.rm_types import split_rm_type

__all__ = ["LABEL_GRADED", "empty_labels_in_rows", "is_empty_label", "needs_label"]

LABEL_GRADED = ("math", "deepscaler", "dapo", "f1")

_EMPTY = r"^\s*(?:\\(?:boxed|fbox)\s*\{\s*\}\s*)?$"
_EMPTY_RE = re.compile(_EMPTY)
_CHUNK = 4096


def needs_label(rm_type: Any) -> bool:
    """True when the built-in `rm_type` compares the response with a label."""
    return isinstance(rm_type, str) and split_rm_type(rm_type)[1] in LABEL_GRADED


def is_empty_label(label: Any) -> bool:
    """True for an empty label (see module docstring); None, numbers and dicts are not."""
    if isinstance(label, str):
        return _EMPTY_RE.match(label) is not None
    if isinstance(label, (list, tuple)):
        return all(is_empty_label(x) or x is None for x in label)
    return False


def _label_of(row: Any, label_key: str, label_field: str | None) -> Any:
    label = row.get(label_key) if isinstance(row, dict) else None
    if label_field is not None and isinstance(label, dict):
        label = label.get(label_field)
    return label


def _row_type(row: Any, metadata_key: str | None, global_type: Any) -> Any:
    meta = row.get(metadata_key) if isinstance(row, dict) and metadata_key else None
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            return global_type  # a bad row: the data source reports it
    value = meta.get("rm_type") if isinstance(meta, dict) else None
    return value or global_type


def _columnar(table: pa.Table, label_key: str) -> np.ndarray | None:
    """Positions of empty string labels, or None when the label column is not plain text."""
    if label_key not in table.column_names:
        return np.zeros(0, dtype=np.int64)
    column = table.column(label_key)
    if pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_null(column.type):
        return np.zeros(0, dtype=np.int64)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return None
    empty = pc.fill_null(pc.match_substring_regex(column, _EMPTY), False)
    return np.flatnonzero(empty.to_numpy(zero_copy_only=False))


def _row_by_row(store: Any, label_key: str, label_field: str | None, metadata_key: str | None,
                global_type: Any, mixed: bool) -> np.ndarray:
    found = []
    for start in range(0, len(store), _CHUNK):
        positions = np.arange(start, min(start + _CHUNK, len(store)))
        try:
            rows = store.rows(positions)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # undecodable lines: the dataset names them
        for i, row in zip(positions.tolist(), rows):
            if is_empty_label(_label_of(row, label_key, label_field)) and (
                    not mixed or needs_label(_row_type(row, metadata_key, global_type))):
                found.append(i)
    return np.array(found, dtype=np.int64)


def empty_labels_in_rows(spec: str, label_key: str, label_field: str | None, metadata_key: str | None,
                         global_type: Any, mixed: bool, cache_dir: str | None = None) -> tuple[int, str, Any, Any]:
    """`(count, where the first is, its label, its rm_type)` of the rows of `spec` whose label is empty; with
    `mixed` only rows whose rm_type (the row's `metadata["rm_type"]`, else `global_type`) needs a
    label count. `(0, "", None, None)` when there is none. Cached under `cache_dir` by the files' sha256."""
    store = open_store(spec)
    len(store)  # indexes the lines, which `store.where` needs
    cache = ArrayCache(cache_dir, "empty_labels")
    key = cache.key({"files": [f.sha256 for f in store.files], "slice": str(parse_data_path(spec)[1]),
                     "label_key": label_key, "label_field": label_field, "metadata_key": metadata_key,
                     "global_type": str(global_type) if mixed else None, "version": 1})
    cached = cache.get(key)
    if cached is not None:
        positions = cached["positions"]
    else:
        table = store.table() if not mixed and label_field is None else None
        positions = _columnar(table, label_key) if table is not None else None
        if positions is None:
            positions = _row_by_row(store, label_key, label_field, metadata_key, global_type, mixed)
        cache.put(key, {"positions": positions})
    if not len(positions):
        return 0, "", None, None
    first = int(positions[0])
    row = store.row(first)
    return len(positions), store.where(first), _label_of(row, label_key, label_field), _row_type(
        row, metadata_key, global_type)
