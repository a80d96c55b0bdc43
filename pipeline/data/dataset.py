"""Prompt datasets (docs/contracts.md §2): read, validate, filter by prompt length; rows decode lazily.

Start-up is columnar: a `.jsonl` file is parsed by pyarrow in one go and validated with
vectorised null/type checks; only when that parse fails (an undecodable line, a non-object
row, types that change between rows) is the file walked line by line, which then names the
exact line. Kept rows are a numpy array of positions; a row becomes Python objects only when
it is fetched. Token lengths for the length filter come from `lengths.py` (batched, cached).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.data.errors import DataError
from pipeline.data.lengths import ArrayCache, TokenizerHandle
from pipeline.data.readers import RowStore, open_store, parse_data_path

__all__ = ["PromptDataset"]

logger = logging.getLogger(__name__)

_SHOWN_SKIPS = 5


class PromptDataset:
    """The prompts of one file after slicing, validation and the max-prompt-length filter.

    `len(ds)` is the number of kept prompts; `ds.fields(k)` returns `(prompt, label, metadata)`
    of the k-th kept prompt (file order) as fresh Python objects.
    """

    def __init__(
        self,
        path: str,
        *,
        input_key: str = "input",
        label_key: str | None = None,
        metadata_key: str | None = "metadata",
        tool_key: str | None = "tools",
        apply_chat_template: bool = False,
        apply_chat_template_kwargs: dict[str, Any] | None = None,
        tokenizer: Any = None,
        max_prompt_len: int | None = None,
        skip_bad_rows: bool = False,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        if not input_key:
            raise DataError("input_key (the prompt key) must be a non-empty string")
        if max_prompt_len is not None and (isinstance(max_prompt_len, bool) or
                                           not isinstance(max_prompt_len, int) or max_prompt_len < 0):
            raise DataError(f"max_prompt_len must be a non-negative integer or null, got {max_prompt_len!r}")
        if (apply_chat_template or max_prompt_len is not None) and tokenizer is None:
            raise DataError(
                "apply_chat_template / max_prompt_len need a tokenizer: pass tokenizer= (a HF "
                "tokenizer folder or object), or hf_checkpoint in a slime args namespace"
            )
        self.path = os.fspath(path)
        self.input_key, self.label_key = input_key, label_key
        self.metadata_key, self.tool_key = metadata_key, tool_key
        self.apply_chat_template = bool(apply_chat_template)
        self.chat_kwargs = dict(apply_chat_template_kwargs or {})
        self.max_prompt_len = max_prompt_len
        self.skip_bad_rows = skip_bad_rows
        self.tokenizer = TokenizerHandle(tokenizer) if tokenizer is not None else None
        self.store: RowStore = open_store(self.path)
        self._cache_dir = cache_dir
        valid = self._valid_rows()
        self.skipped_rows = len(self.store) - len(valid)
        self.too_long = 0
        if max_prompt_len is not None:
            lengths = self._lengths(valid)
            keep = lengths <= max_prompt_len
            self.too_long = int((~keep).sum())
            valid = valid[keep]
        self.rows: np.ndarray = valid
        release = getattr(self.store, "release", None)
        if release is not None:
            release()
        if len(self.rows) == 0:
            raise DataError(
                f"{self.path}: no prompts left ({len(self.store)} rows read, {self.skipped_rows} "
                f"bad rows skipped, {self.too_long} longer than max_prompt_len={max_prompt_len})"
            )
        logger.info("%s: %d prompts (%d rows, %d skipped, %d too long)", self.path,
                    len(self.rows), len(self.store), self.skipped_rows, self.too_long)

    def __len__(self) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------ validation
    def _row_problem(self, row: Any) -> str | None:
        """What is wrong with one decoded row, or None."""
        if not isinstance(row, dict):
            return f"expected a JSON object per row, got {type(row).__name__}"
        prompt = row.get(self.input_key)
        if self.input_key not in row:
            return f"no prompt key {self.input_key!r} (row keys: {sorted(row)[:10]})"
        if prompt is None:
            return f"prompt key {self.input_key!r} is null"
        if not isinstance(prompt, (str, list)):
            return (f"prompt key {self.input_key!r} must be a string or a list of messages, "
                    f"got {type(prompt).__name__}")
        if not prompt or (isinstance(prompt, str) and not prompt.strip()):
            return f"prompt key {self.input_key!r} is empty ({prompt!r}); expected a prompt to generate from"
        if self.label_key is not None and row.get(self.label_key) is None:
            state = "is null" if self.label_key in row else "is missing"
            return (f"label key {self.label_key!r} {state} (row keys: {sorted(row)[:10]}); name the row's answer key "
                    f"with data_source.label_key=<key> (eval.datasets[].label_key for an eval set), or "
                    f"label_key=null for a reward that needs no label")
        if self.metadata_key is not None and row.get(self.metadata_key) is not None:
            meta = row[self.metadata_key]
            if isinstance(meta, str):
                try:
                    meta = json.loads(meta)
                except json.JSONDecodeError as exc:
                    return f"metadata key {self.metadata_key!r} is a string but not JSON ({exc})"
            if not isinstance(meta, dict):
                return f"metadata key {self.metadata_key!r} must be an object, got {type(meta).__name__}"
        if self.tool_key is not None and row.get(self.tool_key) is not None:
            tools = row[self.tool_key]
            if isinstance(tools, str):
                try:
                    tools = json.loads(tools)
                except json.JSONDecodeError as exc:
                    return f"tool key {self.tool_key!r} is a string but not valid JSON ({exc})"
            if not isinstance(tools, list):
                return f"tool key {self.tool_key!r} must be a list (or its JSON text), got {type(tools).__name__}"
        return None

    def _decode_problem(self, i: int) -> str | None:
        try:
            row = self.store.row(i)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return f"not valid JSON ({exc})"
        return self._row_problem(row)

    def _suspects(self, table: pa.Table) -> np.ndarray:
        """Row positions that the vectorised checks cannot clear (usually none)."""
        n = table.num_rows
        names = table.column_names
        if self.input_key not in names:
            return np.arange(n)
        col = table.column(self.input_key)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
                or pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
            return np.arange(n)
        bad = np.zeros(n, dtype=bool)
        _or_mask(bad, pc.is_null(col), col.null_count)
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            empty = pc.equal(pc.list_value_length(col), 0)
        else:  # empty or whitespace-only text
            empty = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(col)), 0)
        _or_mask(bad, pc.fill_null(empty, False), pc.sum(empty).as_py() or 0)
        if self.label_key is not None:
            if self.label_key not in names:
                return np.arange(n)
            label = table.column(self.label_key)
            _or_mask(bad, pc.is_null(label), label.null_count)
        for key, ok in ((self.metadata_key, pa.types.is_struct), (self.tool_key, pa.types.is_list)):
            if key is not None and key in names:
                c = table.column(key)
                if not (ok(c.type) or pa.types.is_null(c.type)):
                    _or_mask(bad, pc.is_valid(c), n - c.null_count)
        return np.flatnonzero(bad)

    def _data_key(self) -> dict[str, Any]:
        return {"files": [f.sha256 for f in self.store.files], "slice": str(parse_data_path(self.path)[1]),
                "keys": [self.input_key, self.label_key, self.metadata_key, self.tool_key],
                "skip_bad_rows": self.skip_bad_rows, "version": 2}

    def _valid_rows(self) -> np.ndarray:
        """Validated row positions, from the index cache when this data was seen before."""
        cache = ArrayCache(self._cache_dir, "prompt_index")
        key = cache.key(self._data_key())
        cached = cache.get(key)
        if cached is not None and "valid" in cached:
            self.store.set_index_arrays({k: v for k, v in cached.items() if k != "valid"})
            if len(self.store) - len(cached["valid"]):
                logger.warning("%s: skipping %d bad rows of %d (validated earlier; index cache %s)",
                               self.path, len(self.store) - len(cached["valid"]), len(self.store), key)
            return cached["valid"]
        valid = self._validate()
        cache.put(key, {**self.store.index_arrays(), "valid": valid})
        return valid

    def _validate(self) -> np.ndarray:
        """Kept row positions; raises on a bad row unless skip_bad_rows."""
        n = len(self.store)
        table = self.store.table()
        suspects: Iterator[int] = iter(self._suspects(table)) if table is not None else iter(range(n))
        bad: list[int] = []
        for i in suspects:
            problem = self._decode_problem(int(i))
            if problem is None:
                continue
            where = self.store.where(int(i))
            if not self.skip_bad_rows:
                raise DataError(f"{where}: {problem} (set skip_bad_rows=true to skip such rows)")
            if len(bad) < _SHOWN_SKIPS:
                logger.warning("skipping %s: %s", where, problem)
            bad.append(int(i))
        if bad:
            logger.warning("%s: skipped %d bad rows of %d", self.path, len(bad), n)
        return np.setdiff1d(np.arange(n, dtype=np.int64), np.asarray(bad, dtype=np.int64))

    # ------------------------------------------------------------------ length filter
    def _texts(self, valid: np.ndarray) -> Iterator[str]:
        """The texts whose token counts decide the length filter, in `valid` order."""
        table = None if self.apply_chat_template else self.store.table()
        col = table.column(self.input_key) if table is not None and self.input_key in table.column_names else None
        if col is not None and (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            step = 65536
            for start in range(0, len(valid), step):
                yield from col.take(pa.array(valid[start:start + step])).to_pylist()
            return
        step = 4096
        for start in range(0, len(valid), step):
            chunk = valid[start:start + step]
            for i, (prompt, _, _) in zip(chunk.tolist(), self._fields_of(self.store.rows(chunk))):
                if not isinstance(prompt, str):
                    raise DataError(
                        f"{self.store.where(i)}: prompt key {self.input_key!r} is a message list; "
                        "max_prompt_len needs apply_chat_template=true to render it to text")
                yield prompt

    def _lengths(self, valid: np.ndarray) -> np.ndarray:
        assert self.tokenizer is not None
        cache = ArrayCache(self._cache_dir, "prompt_lengths")
        key = cache.key({**self._data_key(), "chat": [self.apply_chat_template, self.chat_kwargs],
                         "tokenizer": self.tokenizer.fingerprint()})
        cached = cache.get(key)
        if cached is not None and cached.get("lengths", np.zeros(0)).shape == (len(valid),):
            logger.info("%s: prompt lengths from cache %s", self.path, key)
            return cached["lengths"]
        lengths = self.tokenizer.count(self._texts(valid))
        cache.put(key, {"lengths": lengths})
        return lengths

    # ------------------------------------------------------------------ rows
    def _fields_of(self, rows: list[Any]) -> list[tuple[Any, Any, dict[str, Any]]]:
        """`(prompt, label, metadata)` of decoded rows (tools parsed into metadata["tools"])."""
        out = []
        input_key, label_key, metadata_key, tool_key = self.input_key, self.label_key, self.metadata_key, self.tool_key
        for row in rows:
            prompt = row[input_key]
            # any JSON value (string, number, list, dict) stays as it is; rewards that grade
            # text pick or check it (pipeline.rewards.dispatch.grading_label)
            label = row.get(label_key) if label_key is not None else None
            meta = row.get(metadata_key) if metadata_key is not None else None
            if isinstance(meta, str):
                meta = json.loads(meta)
            meta = meta or {}
            if tool_key is not None and row.get(tool_key) is not None:
                tools = row[tool_key]
                meta["tools"] = json.loads(tools) if isinstance(tools, str) else tools
            if self.apply_chat_template:
                assert self.tokenizer is not None
                messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
                prompt = self.tokenizer.render(messages, meta.get("tools"), self.chat_kwargs)
            out.append((prompt, label, meta))
        return out

    def fields(self, k: int) -> tuple[Any, Any, dict[str, Any]]:
        """`(prompt, label, metadata)` of the k-th kept prompt, decoded afresh."""
        return self._fields_of(self.store.rows(self.rows[k:k + 1]))[0]

    def fields_many(self, ks: np.ndarray) -> list[tuple[Any, Any, dict[str, Any]]]:
        """`fields` of several kept prompts at once (one batched read)."""
        return self._fields_of(self.store.rows(self.rows[ks]))

    def fingerprint(self) -> dict[str, Any]:
        """What identifies the data: files (name, size, sha256), slice, keys, filter settings."""
        return {
            "files": [{"name": os.path.basename(f.path), "size": f.size, "sha256": f.sha256}
                      for f in self.store.files],
            "slice": str(parse_data_path(self.path)[1]),
            "input_key": self.input_key,
            "label_key": self.label_key,
            "metadata_key": self.metadata_key,
            "tool_key": self.tool_key,
            "apply_chat_template": self.apply_chat_template,
            "apply_chat_template_kwargs": self.chat_kwargs,
            "max_prompt_len": self.max_prompt_len,
            "tokenizer": self.tokenizer.fingerprint() if self.tokenizer is not None and
            (self.apply_chat_template or self.max_prompt_len is not None) else None,
            "num_prompts": len(self.rows),
        }


def _or_mask(out: np.ndarray, mask: pa.ChunkedArray, count: int) -> None:
    """`out |= mask` for an arrow boolean mask; skipped when the mask has no true value."""
    if count:
        out |= mask.combine_chunks().to_numpy(zero_copy_only=False)
