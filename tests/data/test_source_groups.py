"""Fresh groups from a data source: both construction paths give the same samples, and every
sample owns its prompt, label and metadata (no shared mutable state between siblings)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.data import sources as sources_mod
from pipeline.data.sources import BufferedDataSource, PlainDataSource, _copies, prompt_groups

pytestmark = pytest.mark.timeout(30)

ROWS = [
    '{"input": "plain text", "label": "1", "metadata": {"a": 1, "b": "x"}}',
    '{"input": [{"role": "user", "content": "hi"}], "label": {"answer": [1, 2]}, "metadata": {"nested": {"k": [1]}}}',
    '{"input": "no metadata", "label": "3"}',
]


def fetch(tmp_path: Path, monkeypatch, fast: bool, n: int = 3) -> list[list[dict]]:
    monkeypatch.setattr(sources_mod, "_FAST_INIT", fast)
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(ROWS) + "\n")
    src = PlainDataSource(prompt_data=str(path), n_samples_per_prompt=n, shuffle=False, label_key="label", apply_chat_template=False)
    src.get_samples(1)
    return [[s.to_dict() for s in g] for g in src.get_samples(4)]


def test_fast_and_plain_construction_give_the_same_samples(tmp_path, monkeypatch):
    fast = fetch(tmp_path, monkeypatch, True)
    slow = fetch(tmp_path, monkeypatch, False)
    assert fast == slow
    assert [[s["group_index"] for s in g] for g in fast] == [[1] * 3, [2] * 3, [3] * 3, [4] * 3]
    assert [[s["index"] for s in g] for g in fast] == [[3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 14]]
    assert fast[0][0]["prompt"] == [{"role": "user", "content": "hi"}] and fast[0][0]["label"] == {"answer": [1, 2]}
    assert fast[1][2]["label"] == "3" and fast[1][2]["metadata"] == {}
    assert all(s["status"] == "pending" and s["tokens"] == [] and s["reward"] is None for g in fast for s in g)


@pytest.mark.parametrize("fast", [True, False])
def test_siblings_share_no_mutable_state(tmp_path, monkeypatch, fast):
    monkeypatch.setattr(sources_mod, "_FAST_INIT", fast)
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(ROWS) + "\n")
    src = BufferedDataSource(prompt_data=str(path), n_samples_per_prompt=3, shuffle=False, label_key="label", apply_chat_template=False)
    groups = src.get_samples(3)
    for g in groups:
        first = g[0]
        first.tokens.append(9)
        first.weight_versions.append("v")
        first.metadata["new"] = 1
        if isinstance(first.prompt, list):
            first.prompt[0]["content"] = "changed"
        if isinstance(first.label, dict):
            first.label["answer"].append(3)
        for s in g[1:]:
            assert s.tokens == [] and s.weight_versions == [] and "new" not in s.metadata
            assert s.prompt != "changed" and (not isinstance(s.prompt, list) or s.prompt[0]["content"] == "hi")
            assert not isinstance(s.label, dict) or s.label == {"answer": [1, 2]}
    again = src.get_samples(3)  # the dataset's own rows were not changed through the samples
    assert again[1][0].prompt == [{"role": "user", "content": "hi"}] and again[1][0].label == {"answer": [1, 2]}
    assert again[0][0].metadata == {"a": 1, "b": "x"}


@pytest.mark.parametrize("value", [
    "text", 3, 2.5, True, None, {"a": 1, "b": "s"}, {"deep": {"x": [1]}}, [{"role": "user"}], b"raw", {"b": b"raw"},
])
def test_copies_are_equal_independent_and_the_first_is_the_value(value):
    out = _copies(value, 3)
    assert len(out) == 3 and out[0] is value and all(c == value for c in out)
    if isinstance(value, (dict, list)):
        assert all(c is not value for c in out[1:]) and out[1] is not out[2]
        if isinstance(value, dict) and "deep" in value:
            out[1]["deep"]["x"].append(2)
            assert value["deep"]["x"] == [1] and out[2]["deep"]["x"] == [1]
    assert _copies(value, 1) == [value]


def test_prompt_groups_number_from_zero_by_default(tmp_path):
    # eval datasets build their groups this way: group_index and index count from 0, as in slime
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(ROWS) + "\n")
    src = PlainDataSource(prompt_data=str(path), n_samples_per_prompt=2, shuffle=False, label_key="label",
                          apply_chat_template=False)
    groups = prompt_groups(src.dataset, np.arange(2), 2)
    assert [[(s.group_index, s.index) for s in g] for g in groups] == [[(0, 0), (0, 1)], [(1, 2), (1, 3)]]
