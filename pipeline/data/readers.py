"""Row stores: the raw rows of one prompt file, read columnar, decoded one row at a time.

A store knows how many rows it has, how to decode row `i` into fresh Python objects, how to
say where row `i` lives (`file line 12` / `file row 11`), and, when it can, how to hand the
whole file to pyarrow as a table for vectorised validation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from pipeline.data.errors import DataError

__all__ = ["RowStore", "FileInfo", "parse_data_path", "open_store"]

logger = logging.getLogger(__name__)

_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")
_WS = frozenset(b" \t\r\n\x0b\x0c")


@dataclass(frozen=True)
class FileInfo:
    """One input file as the fingerprint sees it."""

    path: str
    size: int
    sha256: str


def parse_data_path(spec: str) -> tuple[str, slice | None]:
    """Split `data.jsonl@[a:b]` into the path and a slice (negative bounds allowed)."""
    spec = os.fspath(spec)
    if "@[" in spec:
        m = _SLICE.match(spec)
        if m is None:
            raise DataError(
                f"{spec!r}: bad row slice; expected PATH@[START:END] with integer bounds, "
                "e.g. data.jsonl@[100:], data.jsonl@[-50:], data.jsonl@[10:20]"
            )
        start = int(m["start"]) if m["start"] else None
        end = int(m["end"]) if m["end"] else None
        return m["path"], slice(start, end)
    return spec, None


class RowStore(Protocol):
    """The rows of one file (after the slice)."""

    path: str
    files: list[FileInfo]

    def __len__(self) -> int: ...

    def row(self, i: int) -> Any:
        """Row `i` decoded into fresh Python objects (a dict for a well-formed row)."""
        ...

    def where(self, i: int) -> str:
        """Human position of row `i`, e.g. `data.jsonl line 12`."""
        ...

    def table(self) -> pa.Table | None:
        """All rows as an arrow table, or None when the fast columnar parse is not possible."""
        ...

    def index_arrays(self) -> dict[str, np.ndarray]:
        """Arrays worth caching to skip start-up scanning (may be empty)."""
        ...

    def set_index_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what `index_arrays` returned."""
        ...

    def rows(self, positions: np.ndarray) -> list[Any]:
        """Several rows decoded (batched)."""
        ...


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


class JsonLinesStore:
    """A `.jsonl` file held as bytes plus numpy line offsets; rows decode on demand."""

    def __init__(self, path: str, row_slice: slice | None) -> None:
        self.path = path
        data = Path(path).read_bytes()
        self.files = [FileInfo(path, len(data), hashlib.sha256(data).hexdigest())]
        if data.startswith(b"\xef\xbb\xbf"):
            data = b"   " + data[3:]  # keep byte offsets, drop the BOM
        self._data = data
        self._slice = row_slice
        self._starts = self._ends = self._line_no = np.zeros(0, dtype=np.int64)
        self._indexed = False
        self._table: pa.Table | None | bool = False  # False: not parsed yet

    def _index(self) -> None:
        """Find the non-blank lines (numpy over the bytes), then apply the slice."""
        data = self._data
        buf = np.frombuffer(data, dtype=np.uint8)
        newlines = np.flatnonzero(buf == 10)
        starts = np.concatenate(([0], newlines + 1)).astype(np.int64)
        ends = np.concatenate((newlines, [len(data)])).astype(np.int64)
        line_no = np.arange(1, len(starts) + 1, dtype=np.int64)
        # a line is blank iff it has no byte outside whitespace; most lines start with '{'
        first = buf[np.minimum(starts, len(data) - 1)] if len(data) else np.zeros(1, np.uint8)
        nonblank = (ends > starts) & ~np.isin(first, list(_WS))
        for i in np.flatnonzero(~nonblank & (ends > starts)):
            if any(b not in _WS for b in data[starts[i]:ends[i]]):
                nonblank[i] = True
        keep = np.flatnonzero(nonblank)
        if self._slice is not None:
            keep = keep[self._slice]
        self._starts, self._ends, self._line_no = starts[keep], ends[keep], line_no[keep]
        self._indexed = True

    def index_arrays(self) -> dict[str, np.ndarray]:
        """The line index (for the on-disk index cache)."""
        if not self._indexed:
            self._index()
        return {"starts": self._starts, "ends": self._ends, "line_no": self._line_no}

    def set_index_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore a cached line index instead of scanning the bytes."""
        self._starts, self._ends, self._line_no = arrays["starts"], arrays["ends"], arrays["line_no"]
        self._indexed = True

    def raw_rows(self, positions: np.ndarray) -> list[bytes]:
        """The bytes of several rows (batched: one numpy gather, no per-row numpy scalars)."""
        data = self._data
        return [data[a:b] for a, b in zip(self._starts[positions].tolist(), self._ends[positions].tolist())]

    def __len__(self) -> int:
        if not self._indexed:
            self._index()
        return len(self._starts)

    def row(self, i: int) -> Any:
        if not self._indexed:
            self._index()
        return json.loads(self._data[self._starts[i]:self._ends[i]])

    def rows(self, positions: np.ndarray) -> list[Any]:
        raw = self.raw_rows(positions)
        if len(raw) > 1:
            try:  # one parse for the batch; a bad row falls through to the per-row parse
                rows = json.loads(b"[" + b",".join(raw) + b"]")
                if len(rows) == len(raw):
                    return rows
            except (json.JSONDecodeError, UnicodeDecodeError):
                pass
        return [json.loads(b) for b in raw]

    def where(self, i: int) -> str:
        return f"{self.path} line {int(self._line_no[i])}"

    def table(self) -> pa.Table | None:
        if self._table is not False:  # parsed once per start-up (validation, then lengths)
            return self._table
        self._table = None
        if len(self) == 0:
            return None
        chunk = memoryview(self._data)[int(self._starts[0]):int(self._ends[-1])]
        try:
            table = pajson.read_json(pa.BufferReader(pa.py_buffer(chunk)))
            table.validate(full=True)  # arrow's JSON reader lets invalid UTF-8 through unchecked
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            logger.info("%s: columnar JSON parse not possible (%s); validating line by line",
                        self.path, exc)
            return None
        if table.num_rows == len(self):  # not e.g. two objects on one line
            self._table = table
        return self._table

    def release(self) -> None:
        """Drop the parsed table (rows are decoded from the bytes after start-up)."""
        self._table = False


class TableStore:
    """Rows of an arrow table (parquet file, HF `datasets` folder)."""

    def __init__(self, path: str, table: pa.Table, files: list[FileInfo], offset: int = 0) -> None:
        self.path = path
        self._offset = offset
        self.files = files
        self._table = table
        self._columns = {name: table.column(name) for name in table.column_names}

    def __len__(self) -> int:
        return self._table.num_rows

    def row(self, i: int) -> Any:
        return {name: col[i].as_py() for name, col in self._columns.items()}

    def rows(self, positions: np.ndarray) -> list[Any]:
        return self._table.take(pa.array(positions, type=pa.int64())).to_pylist()

    def index_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def set_index_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        return None

    def where(self, i: int) -> str:
        return f"{self.path} row {self._offset + i} (0-based)"

    def table(self) -> pa.Table | None:
        return self._table


class JsonArrayStore:
    """A `.json` file holding one list of rows; each row is kept as JSON text."""

    def __init__(self, path: str, row_slice: slice | None) -> None:
        self.path = path
        data = Path(path).read_bytes()
        self.files = [FileInfo(path, len(data), hashlib.sha256(data).hexdigest())]
        try:
            rows = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(rows, list):
            raise DataError(
                f"{path}: a .json prompt file must hold a list of objects, got {type(rows).__name__}"
            )
        positions = list(range(len(rows)))
        if row_slice is not None:
            positions = positions[row_slice]
        self._pos = positions
        self._texts = [json.dumps(rows[p]) for p in positions]

    def __len__(self) -> int:
        return len(self._texts)

    def row(self, i: int) -> Any:
        return json.loads(self._texts[i])

    def rows(self, positions: np.ndarray) -> list[Any]:
        return [json.loads(self._texts[i]) for i in positions.tolist()]

    def index_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def set_index_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        return None

    def where(self, i: int) -> str:
        return f"{self.path} element {self._pos[i]} (0-based)"

    def table(self) -> pa.Table | None:
        return None


def _hf_store(path: str, row_slice: slice | None) -> TableStore:
    import datasets  # local import: heavy, and only needed for this format

    try:
        ds = datasets.load_from_disk(path)
    except Exception as exc:  # noqa: BLE001 - datasets raises many types
        raise DataError(f"{path}: not a HF datasets folder saved with save_to_disk ({exc})") from exc
    if isinstance(ds, datasets.DatasetDict):
        if len(ds) != 1:
            raise DataError(
                f"{path}: a DatasetDict with splits {sorted(ds)}; point the path at one split "
                f"folder, e.g. {path}/{sorted(ds)[0]}"
            )
        ds = next(iter(ds.values()))
    table = ds.data.table
    if ds._indices is not None:  # a selected/shuffled view: materialise its rows
        table = ds.flatten_indices().data.table
    files = sorted(p for p in Path(path).rglob("*") if p.is_file())
    infos = [FileInfo(str(p), p.stat().st_size, _sha256_file(p)) for p in files]
    sliced, offset = _apply_slice(table, row_slice)
    return TableStore(path, sliced, infos, offset)


def _apply_slice(table: pa.Table, row_slice: slice | None) -> tuple[pa.Table, int]:
    """The sliced table and the file row of its first row (steps other than 1 are not allowed)."""
    if row_slice is None:
        return table, 0
    start, stop, _ = row_slice.indices(table.num_rows)
    return table.slice(start, max(stop - start, 0)), start


def open_store(spec: str) -> RowStore:
    """Open `path[@[a:b]]` as a row store: .jsonl, .parquet, .json list or HF datasets folder."""
    path, row_slice = parse_data_path(spec)
    p = Path(path)
    if not p.exists():
        raise DataError(f"prompt data {path!r} does not exist")
    if p.is_dir():
        return _hf_store(path, row_slice)
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        return JsonLinesStore(path, row_slice)
    if suffix == ".json":
        return JsonArrayStore(path, row_slice)
    if suffix == ".parquet":
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise DataError(f"{path}: not a readable parquet file ({exc})") from exc
        info = FileInfo(path, p.stat().st_size, _sha256_file(p))
        sliced, offset = _apply_slice(table, row_slice)
        return TableStore(path, sliced, [info], offset)
    raise DataError(
        f"{path}: unsupported prompt file type {suffix or '(none)'!r}; expected .jsonl, .parquet, "
        ".json (a list of objects) or a HF datasets folder saved with save_to_disk"
    )
