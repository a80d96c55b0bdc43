"""The empty-label rule and its pre-flight scan (pipeline/rewards/labels.py), called directly: which
labels are empty, where a row's label and rm_type come from, the columnar and the row-by-row
scans giving the same rows, and the cache of the scan (used, and keyed by everything that
changes the answer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pipeline.rewards import labels
from pipeline.rewards.labels import empty_labels_in_rows, is_empty_label


@pytest.mark.parametrize(("label", "empty"), [
    ("", True), ("  \t", True), ("\\boxed{}", True), (" \\fbox{ } ", True), ("0", False), ("\\boxed{0}", False),
    ([], True), (["", None, " "], True), (["", "1"], False), ([None], True), ((" ", "\\boxed{}"), True),
    ([["", None]], True), (None, False), (0, False), ({}, False), ({"a": ""}, False)])
def test_which_labels_are_empty(label: Any, empty: bool) -> None:
    assert is_empty_label(label) is empty


@pytest.mark.parametrize(("row", "field", "label"), [
    ({"label": "3"}, None, "3"), ({"label": {"answer": "3", "x": 1}}, "answer", "3"),
    ({"label": {"answer": "3"}}, None, {"answer": "3"}), ({"label": "3"}, "answer", "3"),
    ({"other": "3"}, None, None), (["label"], None, None), ("label", None, None)])
def test_the_label_of_a_row(row: Any, field: str | None, label: Any) -> None:
    assert labels._label_of(row, "label", field) == label


@pytest.mark.parametrize(("row", "key", "rm_type"), [
    ({"metadata": {"rm_type": "f1"}}, "metadata", "f1"), ({"metadata": json.dumps({"rm_type": "f1"})}, "metadata", "f1"),
    ({"metadata": "{not json"}, "metadata", "math"), ({"metadata": {}}, "metadata", "math"),
    ({"metadata": {"rm_type": ""}}, "metadata", "math"), ({"metadata": ["rm_type"]}, "metadata", "math"),
    ({"metadata": {"rm_type": "f1"}}, None, "math"), ({"metadata": {"rm_type": "f1"}}, "", "math"),
    ("metadata", "metadata", "math"), ({"metadata": "null"}, "metadata", "math")])
def test_the_rm_type_of_a_row(row: Any, key: str | None, rm_type: str) -> None:
    assert labels._row_type(row, key, "math") == rm_type


@pytest.mark.parametrize(("column", "expected"), [
    (pa.array(["1", "", None, " \\boxed{} ", "x"]), [1, 3]),
    (pa.array(["", "2"], type=pa.large_string()), [0]),
    (pa.array([1, 2]), []), (pa.array([1.5, None]), []), (pa.array([None, None]), []),
    (pa.array([[""], ["1"]]), None), (pa.array([{"a": ""}]), None), (pa.array([True]), None)])
def test_the_columnar_scan(column: pa.Array, expected: list[int] | None) -> None:
    positions = labels._columnar(pa.table({"label": column}), "label")
    if expected is None:
        assert positions is None  # not plain text: the row-by-row scan decides
    else:
        assert positions.dtype == np.int64 and positions.tolist() == expected


def test_the_columnar_scan_of_a_table_without_the_label_column() -> None:
    positions = labels._columnar(pa.table({"input": ["q"]}), "label")
    assert positions.dtype == np.int64 and positions.tolist() == []


def _write(path: Path, rows: list[Any]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _row(label: Any, rm_type: str | None = None) -> dict[str, Any]:
    return {"input": "q", "label": label, "metadata": {"rm_type": rm_type} if rm_type else {}}


def test_the_scan_names_the_first_empty_row_and_counts_them(tmp_path: Path) -> None:
    spec = _write(tmp_path / "d.jsonl", [_row("1"), _row(""), _row("2"), _row("\\boxed{}")])
    assert empty_labels_in_rows(spec, "label", None, "metadata", "math", False) == (
        2, f"{spec} line 2", "", "math")
    clean = _write(tmp_path / "c.jsonl", [_row("1")])
    assert empty_labels_in_rows(clean, "label", None, "metadata", "math", False) == (0, "", None, None)


def test_the_scan_takes_the_columnar_path_for_plain_text_labels(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rows(*a: Any) -> np.ndarray:
        raise AssertionError("row by row although the label column is plain text")
    monkeypatch.setattr(labels, "_row_by_row", no_rows)
    spec = _write(tmp_path / "d.jsonl", [_row("1"), _row(" ")])
    assert empty_labels_in_rows(spec, "label", None, "metadata", "math", False)[:2] == (1, f"{spec} line 2")


def test_a_label_field_and_per_row_types_scan_row_by_row(tmp_path: Path) -> None:
    rows = [{"input": "q", "label": {"answer": "3", "hint": ""}, "metadata": {"rm_type": "math"}},
            {"input": "q", "label": {"answer": "", "hint": "x"}, "metadata": {"rm_type": "math"}},
            {"input": "q", "label": "", "metadata": {"rm_type": "random"}},
            {"input": "q", "label": {"answer": " "}, "metadata": {"rm_type": "boxed_f1"}}]
    spec = _write(tmp_path / "d.jsonl", rows)
    # the field is read (the hint's empty string is not the label); line 3 is a string, not a dict
    assert empty_labels_in_rows(spec, "label", "answer", "metadata", "math", False) == (
        3, f"{spec} line 2", "", "math")
    # mixed: only rows whose own rm_type needs a label count (line 3's random does not)
    assert empty_labels_in_rows(spec, "label", "answer", "metadata", "math", True) == (
        2, f"{spec} line 2", "", "math")
    assert empty_labels_in_rows(spec, "label", "answer", "metadata", "random", True)[0] == 2
    # without a metadata key every row has the run's type
    assert empty_labels_in_rows(spec, "label", "answer", None, "random", True) == (0, "", None, None)


def test_row_by_row_reads_every_chunk_from_the_first_row_and_skips_an_undecodable_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(labels, "_CHUNK", 2)
    spec = _write(tmp_path / "d.jsonl", [_row(""), _row("1"), "{bad json", _row(""), _row(" ")])
    store = labels.open_store(spec)
    found = labels._row_by_row(store, "label", None, None, "math", False)
    assert found.dtype == np.int64 and found.tolist() == [0, 4]  # the chunk of the bad line is skipped
    clean = labels.open_store(_write(tmp_path / "c.jsonl", [_row("1"), _row(""), _row("2"), _row("")]))
    assert labels._row_by_row(clean, "label", None, None, "math", False).tolist() == [1, 3]
    assert labels._row_by_row(clean, "label", None, None, "random", True).tolist() == []


def test_row_by_row_of_no_empty_label_is_an_empty_int_array(tmp_path: Path) -> None:
    store = labels.open_store(_write(tmp_path / "d.jsonl", [_row("1")]))
    found = labels._row_by_row(store, "label", None, None, "math", False)
    assert found.dtype == np.int64 and found.tolist() == []


def test_the_scan_is_cached_under_the_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _write(tmp_path / "d.jsonl", [_row("1"), _row("")])
    cache = tmp_path / "cache"
    first = empty_labels_in_rows(spec, "label", None, "metadata", "math", False, str(cache))
    assert [p.parent.name for p in cache.rglob("*.npz")] == ["empty_labels"]

    def no_scan(*a: Any) -> None:
        raise AssertionError("scanned again although the answer is cached")
    monkeypatch.setattr(labels, "_columnar", no_scan)
    monkeypatch.setattr(labels, "_row_by_row", no_scan)
    assert empty_labels_in_rows(spec, "label", None, "metadata", "math", False, str(cache)) == first


def test_the_cache_keys_everything_that_changes_the_answer(tmp_path: Path) -> None:
    rows = [{"input": "q", "label": "1", "answer": "", "metadata": {"rm_type": "random"}, "meta2": {"rm_type": "f1"}},
            {"input": "q", "label": "", "answer": "2", "metadata": {"rm_type": "random"}, "meta2": {"rm_type": "f1"}},
            {"input": "q", "label": {"a": ""}, "answer": "3", "metadata": {}, "meta2": {}}]
    spec = _write(tmp_path / "d.jsonl", rows)
    cache = str(tmp_path / "cache")

    def scan(spec: str = spec, key: str = "label", field: str | None = None, meta: str | None = "metadata",
             rm_type: str = "math", mixed: bool = False) -> tuple[int, str]:
        with_cache = empty_labels_in_rows(spec, key, field, meta, rm_type, mixed, cache)
        assert with_cache == empty_labels_in_rows(spec, key, field, meta, rm_type, mixed)  # same as uncached
        return with_cache[:2]

    assert scan() == (1, f"{spec} line 2")
    assert scan(f"{spec}@[2:]") == (0, "")  # another slice of the same file
    assert scan(key="answer") == (1, f"{spec} line 1")
    assert scan(field="a") == (2, f"{spec} line 2")  # line 2's label is a string, no dict to read "a" from
    assert scan(mixed=True) == (0, "")  # line 2's own rm_type is random; line 3's label is no string
    assert scan(mixed=True, rm_type="random", field="a") == (0, "")
    assert scan(mixed=True, rm_type="math", field="a") == (1, f"{spec} line 3")
    assert scan(mixed=True, meta="meta2") == (1, f"{spec} line 2")
    Path(spec).write_text(Path(spec).read_text().replace('"label": ""', '"label": "9"'))  # new content
    assert scan() == (0, "")
