"""Bad inputs of the data layer: each gives a clear error naming file/line/key (docs/data_errors.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import BufferedDataSource, PlainDataSource
from pipeline.data.errors import CheckpointError, DataError, DataFingerprintMismatch
from tests.data.conftest import make_rows, write_jsonl

DOC = Path(__file__).resolve().parents[2] / "docs" / "data_errors.md"


def jsonl(tmp: Path, text: str) -> str:
    (tmp / "d.jsonl").write_text(text)
    return str(tmp / "d.jsonl")


def src(path: str, **kw: Any) -> PlainDataSource:
    return PlainDataSource(prompt_data=path, **{"n_samples_per_prompt": 2, "label_key": None, "apply_chat_template": False, **kw})


def _parquet_null(tmp: Path) -> None:
    pq.write_table(pa.Table.from_pylist([{"input": "a"}, {"input": None}]), tmp / "d.parquet")
    src(str(tmp / "d.parquet"))


def _datasetdict(tmp: Path) -> None:
    import datasets

    d = datasets.Dataset.from_list(make_rows(2))
    datasets.DatasetDict({"train": d, "test": d}).save_to_disk(str(tmp / "hf"))
    src(str(tmp / "hf"))


def _fingerprint(tmp: Path) -> None:
    path = write_jsonl(tmp / "d.jsonl", make_rows(3))
    src(path, save_dir=tmp / "ck").save(0)
    src(path, save_dir=tmp / "ck", seed=7).load()


def _truncated(tmp: Path) -> None:
    path = write_jsonl(tmp / "d.jsonl", make_rows(3))
    f = src(path, save_dir=tmp / "ck").save(0)
    f.write_bytes(f.read_bytes()[:-3])
    src(path, save_dir=tmp / "ck").load(0)


def _group_size(tmp: Path) -> None:
    b = BufferedDataSource(prompt_data=write_jsonl(tmp / "d.jsonl", make_rows(3)), n_samples_per_prompt=2, label_key=None, apply_chat_template=False)
    b.add_samples([b.get_samples(1)[0][:1]])


# (id, action, expected error type, message fragment); the fragments are quoted in the doc table
CASES: list[tuple[str, Callable[[Path], Any], type[Exception], str]] = [
    ("missing-file", lambda t: src(str(t / "nope.jsonl")), DataError, "does not exist"),
    ("unknown-format", lambda t: src(str((t / "d.csv", (t / "d.csv").write_text("a"))[0])), DataError,
     "unsupported prompt file type '.csv'"),
    ("bad-slice", lambda t: src(jsonl(t, '{"input":"a"}\n') + "@[1:x]"), DataError, "bad row slice"),
    ("undecodable-line", lambda t: src(jsonl(t, '{"input":"a"}\n{"input": "b"\n')), DataError,
     "d.jsonl line 2: not valid JSON"),
    ("non-object-row", lambda t: src(jsonl(t, '{"input":"a"}\n\n["b"]\n')), DataError,
     "d.jsonl line 3: expected a JSON object per row, got list"),
    ("missing-prompt-key", lambda t: src(jsonl(t, '{"input":"a"}\n{"question":"b"}\n')), DataError,
     "d.jsonl line 2: no prompt key 'input'"),
    ("null-prompt", lambda t: src(jsonl(t, '{"input":null}\n')), DataError, "d.jsonl line 1: prompt key 'input' is null"),
    ("prompt-wrong-type", lambda t: src(jsonl(t, '{"input":"a"}\n{"input":3}\n')), DataError,
     "d.jsonl line 2: prompt key 'input' must be a string or a list of messages, got int"),
    ("empty-prompt", lambda t: src(jsonl(t, '{"input":"a"}\n{"input":" "}\n')), DataError,
     "d.jsonl line 2: prompt key 'input' is empty (' '); expected a prompt to generate from"),
    ("empty-message-list", lambda t: src(jsonl(t, '{"input":[{"role":"user","content":"a"}]}\n{"input":[]}\n')),
     DataError, "d.jsonl line 2: prompt key 'input' is empty ([])"),
    ("missing-label", lambda t: src(jsonl(t, '{"input":"a","label":"1"}\n{"input":"b"}\n'), label_key="label"),
     DataError, "d.jsonl line 2: label key 'label' is missing (row keys: ['input']); name the row's answer key "
                "with data_source.label_key=<key>"),
    ("null-label", lambda t: src(jsonl(t, '{"input":"a","answer":null}\n'), label_key="answer"),
     DataError, "d.jsonl line 1: label key 'answer' is null (row keys: ['answer', 'input'])"),
    ("tools-bad-json", lambda t: src(jsonl(t, '{"input":"a","tools":"[{oops"}\n')), DataError,
     "d.jsonl line 1: tool key 'tools' is a string but not valid JSON"),
    ("tools-not-list", lambda t: src(jsonl(t, '{"input":"a","tools":{"name":"f"}}\n')), DataError,
     "d.jsonl line 1: tool key 'tools' must be a list (or its JSON text), got dict"),
    ("metadata-not-object", lambda t: src(jsonl(t, '{"input":"a","metadata":[1]}\n')), DataError,
     "d.jsonl line 1: metadata key 'metadata' must be an object, got list"),
    ("parquet-null-prompt", _parquet_null, DataError, "d.parquet row 1 (0-based): prompt key 'input' is null"),
    ("json-not-a-list", lambda t: src(str((t / "d.json", (t / "d.json").write_text('{"input":"a"}'))[0])),
     DataError, "a .json prompt file must hold a list of objects, got dict"),
    ("datasetdict", _datasetdict, DataError, "a DatasetDict with splits ['test', 'train']"),
    ("empty-after-filter", lambda t: src(jsonl(t, "\n\n")), DataError, "no prompts left (0 rows read"),
    ("length-filter-no-tokenizer", lambda t: src(jsonl(t, '{"input":"a"}\n'), max_prompt_len=4), DataError,
     "apply_chat_template / max_prompt_len need a tokenizer"),
    ("tokenizer-not-a-folder", lambda t: src(jsonl(t, '{"input":"a"}\n'), max_prompt_len=4, tokenizer=str(t / "x")),
     DataError, "is not a folder"),
    ("n-samples-zero", lambda t: src(jsonl(t, '{"input":"a"}\n'), n_samples_per_prompt=0), DataError,
     "n_samples_per_prompt must be an integer >= 1, got 0"),
    ("negative-num-groups", lambda t: src(jsonl(t, '{"input":"a"}\n')).get_samples(-1), DataError,
     "num_groups must be a non-negative integer, got -1"),
    ("add-wrong-group-size", _group_size, DataError, "group 0 has 1 samples, expected n_samples_per_prompt=2"),
    ("fingerprint-mismatch", _fingerprint, DataFingerprintMismatch,
     "was written for different data: seed: checkpoint has 42, now 7"),
    ("truncated-checkpoint", _truncated, CheckpointError, "truncated checkpoint"),
]


@pytest.mark.parametrize(("case", "action", "exc", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(tmp_path: Path, case: str, action: Callable[[Path], Any], exc: type[Exception],
                   fragment: str) -> None:
    with pytest.raises(exc) as err:
        action(tmp_path)
    assert fragment in str(err.value)


def test_doc_table_lists_every_case() -> None:
    text = DOC.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) >= 12
    for case, _, _, fragment in CASES:
        row = next((r for r in rows if r.startswith(f"| `{case}`")), None)
        assert row is not None, f"{case} missing from {DOC.name}"
        assert fragment.replace("|", "\\|") in row, f"{case}: doc row does not quote {fragment!r}"
