"""docs/contracts.md §2: prompt files, slices, keys, tools, chat template, length filter and its cache."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data.dataset import PromptDataset
from pipeline.data.lengths import TokenizerHandle
from tests.data.conftest import make_rows, write_jsonl


def prompts(ds: PromptDataset) -> list[Any]:
    return [ds.fields(k)[0] for k in range(len(ds))]


def test_formats_give_the_same_rows(tmp_path: Path) -> None:
    import datasets

    rows = make_rows(6)
    jl = write_jsonl(tmp_path / "a.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    (tmp_path / "a.json").write_text(json.dumps(rows))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf"))
    expected = [(f"q{i}", str(i), {"i": i}) for i in range(6)]
    for path in (jl, tmp_path / "a.parquet", tmp_path / "a.json", tmp_path / "hf"):
        ds = PromptDataset(str(path), label_key="label")
        assert [ds.fields(k) for k in range(len(ds))] == expected, path


@pytest.mark.parametrize(("suffix", "expected"), [
    ("@[2:]", [2, 3, 4, 5, 6, 7, 8, 9]), ("@[-3:]", [7, 8, 9]), ("@[1:4]", [1, 2, 3]),
    ("@[:-8]", [0, 1]), ("@[-4:-2]", [6, 7]), ("@[:]", list(range(10))),
])
@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "json"])
def test_slices(tmp_path: Path, fmt: str, suffix: str, expected: list[int]) -> None:
    rows = make_rows(10)
    path = tmp_path / f"d.{fmt}"
    if fmt == "jsonl":
        # blank lines do not count as rows
        path.write_text("\n".join(json.dumps(r) + ("\n  " if i == 3 else "") for i, r in enumerate(rows)))
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text(json.dumps(rows))
    assert prompts(PromptDataset(f"{path}{suffix}")) == [f"q{i}" for i in expected]


def test_custom_keys_tools_and_metadata(tmp_path: Path) -> None:
    rows = [
        {"question": "a", "answer": 3, "info": {"rm_type": "math"}, "fns": json.dumps([{"name": "f"}])},
        {"question": "b", "answer": "x", "info": None, "fns": [{"name": "g"}]},
        {"question": "c", "answer": "y"},
    ]
    ds = PromptDataset(write_jsonl(tmp_path / "k.jsonl", rows), input_key="question", label_key="answer",
                       metadata_key="info", tool_key="fns")
    assert ds.fields(0) == ("a", 3, {"rm_type": "math", "tools": [{"name": "f"}]})  # labels stay JSON values
    assert ds.fields(1) == ("b", "x", {"tools": [{"name": "g"}]})
    assert ds.fields(2) == ("c", "y", {})


def test_message_list_prompts_pass_through(tmp_path: Path) -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    ds = PromptDataset(write_jsonl(tmp_path / "m.jsonl", [{"input": msgs}]))
    assert ds.fields(0)[0] == msgs


def test_chat_template_renders_with_tools(tmp_path: Path, tokenizer_dir: str) -> None:
    rows = [{"input": "q1 w2", "tools": '[{"name": "f"}]'}, {"input": "q2"}]
    ds = PromptDataset(write_jsonl(tmp_path / "c.jsonl", rows), apply_chat_template=True, tokenizer=tokenizer_dir)
    assert ds.fields(0)[0] == '<tools>[{"name": "f"}]</tools>\n<user>q1 w2</user>\n<assistant>'
    assert ds.fields(1)[0] == "<user>q2</user>\n<assistant>"


def test_length_filter_keeps_order_and_counts_like_slime(tmp_path: Path, tokenizer_dir: str) -> None:
    words = [" ".join(f"w{j}" for j in range(n)) for n in [3, 7, 1, 5, 5, 6, 2]]
    path = write_jsonl(tmp_path / "l.jsonl", [{"input": w} for w in words])
    ds = PromptDataset(path, tokenizer=tokenizer_dir, max_prompt_len=5)
    assert prompts(ds) == [words[i] for i in (0, 2, 3, 4, 6)] and ds.too_long == 2
    handle = TokenizerHandle(tokenizer_dir)
    slime_counts = [len(handle.obj.encode(w, add_special_tokens=False)) for w in words]
    assert handle.count(words).tolist() == slime_counts == [3, 7, 1, 5, 5, 6, 2]


def test_length_filter_with_chat_template(tmp_path: Path, tokenizer_dir: str) -> None:
    path = write_jsonl(tmp_path / "l.jsonl", [{"input": "w1 w2"}, {"input": "w1"}])
    # "<user>w1 w2</user>\n<assistant>" splits on whitespace into 3 words, the other into 2
    ds = PromptDataset(path, tokenizer=tokenizer_dir, apply_chat_template=True, max_prompt_len=2)
    assert prompts(ds) == ["<user>w1</user>\n<assistant>"]


def test_length_cache_warm_start_does_no_tokenisation(tmp_path: Path, tokenizer_dir: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = TokenizerHandle.count

    def counting(self: TokenizerHandle, texts: Any) -> np.ndarray:
        out = original(self, texts)
        calls.append(len(out))
        return out

    monkeypatch.setattr(TokenizerHandle, "count", counting)
    path = write_jsonl(tmp_path / "w.jsonl", [{"input": " ".join(["w1"] * (1 + i % 9))} for i in range(50)])
    cache = tmp_path / "cache"
    cold = PromptDataset(path, tokenizer=tokenizer_dir, max_prompt_len=4, cache_dir=cache)
    assert calls == [50]
    assert len(list((cache / "prompt_lengths").glob("*.npz"))) == 1
    warm = PromptDataset(path, tokenizer=tokenizer_dir, max_prompt_len=4, cache_dir=cache)
    assert calls == [50]
    assert warm.tokenizer is not None and warm.tokenizer._obj is None  # not even loaded
    assert np.array_equal(cold.rows, warm.rows) and len(warm) == sum(1 + i % 9 <= 4 for i in range(50))
    # another max length reuses the cached lengths; changed data does not
    PromptDataset(path, tokenizer=tokenizer_dir, max_prompt_len=2, cache_dir=cache)
    assert calls == [50]
    write_jsonl(Path(path), [{"input": "w1"}] * 3)
    PromptDataset(path, tokenizer=tokenizer_dir, max_prompt_len=2, cache_dir=cache)
    assert calls == [50, 3]


def test_skip_bad_rows_counts_and_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"input": "a"}\n{bad json\n[1]\n{"x": 1}\n{"input": null}\n{"input": "b"}\n')
    with caplog.at_level(logging.WARNING):
        ds = PromptDataset(str(path), skip_bad_rows=True)
    assert prompts(ds) == ["a", "b"] and ds.skipped_rows == 4
    assert "s.jsonl line 2" in caplog.text and "skipped 4 bad rows of 6" in caplog.text


def test_skip_bad_rows_columnar_path(tmp_path: Path) -> None:
    # parses as a table; only the null-prompt row is suspect
    rows = [{"input": "a", "label": "1"}, {"input": None, "label": "2"}, {"input": "c"}]
    ds = PromptDataset(write_jsonl(tmp_path / "n.jsonl", rows), label_key="label", skip_bad_rows=True)
    assert prompts(ds) == ["a"] and ds.skipped_rows == 2


def test_inconsistent_but_valid_types_fall_back_to_line_by_line(tmp_path: Path) -> None:
    rows = [{"input": "a", "metadata": {"k": 1}}, {"input": "b", "metadata": {"k": "x"}},
            {"input": [{"role": "user", "content": "c"}]}]
    ds = PromptDataset(write_jsonl(tmp_path / "i.jsonl", rows))
    assert [ds.fields(k)[2] for k in range(3)] == [{"k": 1}, {"k": "x"}, {}]


def test_fingerprint_names_files_and_settings(data5: str) -> None:
    fp = PromptDataset(data5).fingerprint()
    assert fp["files"][0]["name"] == "q.jsonl" and len(fp["files"][0]["sha256"]) == 64
    assert fp["num_prompts"] == 5 and fp["input_key"] == "input"


def test_index_cache_skips_parsing_on_warm_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    from pipeline.data.readers import JsonLinesStore

    path = tmp_path / "x.jsonl"
    path.write_text('{"input": "a"}\n\n{"input": 1}\n{"input": "c", "label": "z"}\n')
    cache = tmp_path / "cache"
    cold = PromptDataset(str(path), skip_bad_rows=True, cache_dir=cache)
    parses: list[int] = []
    original = JsonLinesStore.table
    monkeypatch.setattr(JsonLinesStore, "table", lambda self: parses.append(1) or original(self))
    monkeypatch.setattr(JsonLinesStore, "_index", lambda self: pytest.fail("line scan on a warm start"))
    with caplog.at_level(logging.WARNING):
        warm = PromptDataset(str(path), skip_bad_rows=True, cache_dir=cache)
    assert parses == [] and prompts(warm) == prompts(cold) == ["a", "c"] and warm.skipped_rows == 1
    assert "skipping 1 bad rows of 3" in caplog.text
    assert warm.store.where(int(warm.rows[1])).endswith("x.jsonl line 4")
    # without skip_bad_rows the cached index does not apply: the bad row is an error again
    monkeypatch.undo()
    with pytest.raises(Exception, match="x.jsonl line 3"):
        PromptDataset(str(path), cache_dir=cache)
