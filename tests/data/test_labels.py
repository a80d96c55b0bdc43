"""Labels stay JSON values end to end (issue 10, item 5): a number, list or dict label is the same
value in the Sample, the sample dump, a checkpoint's buffer and a replay; and a batch larger than
the dataset is noted once (item 9)."""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline import BufferedDataSource, PlainDataSource
from pipeline.rollout.replay import ReplayRollout
from pipeline.sinks.files import read_samples, write_samples
from tests.data.conftest import write_jsonl

LABELS = [{"answer": 10, "points": 3}, [1, 2], 7, 2.5, "12", {"answer": "x", "points": 1.5}]


def _source(tmp: Path, cls: type = BufferedDataSource, **kw) -> PlainDataSource:
    path = write_jsonl(tmp / "d.jsonl", [{"input": f"q{i}", "label": label} for i, label in enumerate(LABELS)])
    return cls(prompt_data=path, n_samples_per_prompt=2, shuffle=False, **{"label_key": "label", "apply_chat_template": False, **kw})


def _same(a: object, b: object) -> bool:
    """Equal with the same types all the way down (7 is not 7.0 nor "7")."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_labels_keep_their_json_type_in_samples(tmp_path):
    groups = _source(tmp_path, PlainDataSource).get_samples(len(LABELS))
    for label, group in zip(LABELS, groups):
        assert all(_same(s.label, label) for s in group), (label, group[0].label)
    a, b = groups[0]
    a.label["answer"] = 99  # each sample owns its copy
    assert b.label["answer"] == 10


def test_labels_survive_dumps_replay_and_checkpoints(tmp_path):
    src = _source(tmp_path, save_dir=tmp_path / "ck")
    groups = src.get_samples(len(LABELS))
    run = tmp_path / "run"
    write_samples(run / "samples" / "rollout_0.jsonl", [s for g in groups for s in g])
    dumped = read_samples(run / "samples" / "rollout_0.jsonl")
    assert [s.label for s in dumped] == [label for label in LABELS for _ in range(2)]
    assert all(_same(s.label, label) for s, label in zip(dumped[::2], LABELS))
    replayed = ReplayRollout(str(run))(None, 0, None).samples
    assert all(_same(g[0].label, label) for g, label in zip(replayed, LABELS))
    # mixed label types in one buffer, then label types one at a time (per-type column codecs)
    for buffer in (groups, *([g] for g in groups)):
        src.buffer = [list(g) for g in buffer]
        src.save(0)
        back = _source(tmp_path, save_dir=tmp_path / "ck")
        assert back.load(0) == 0
        assert all(_same(s.label, t.label) for g, h in zip(back.buffer, buffer) for s, t in zip(g, h))
        state = src.state_dict()
        other = _source(tmp_path)
        other.load_state_dict(state)
        assert all(_same(s.label, t.label) for g, h in zip(other.buffer, buffer) for s, t in zip(g, h))


def test_a_batch_larger_than_the_dataset_is_noted_once(tmp_path, caplog):
    src = _source(tmp_path, PlainDataSource)
    with caplog.at_level(logging.WARNING, logger="pipeline.data.sources"):
        src.get_samples(len(LABELS))  # exactly one epoch: no note
        assert not caplog.records
        groups = src.get_samples(len(LABELS) + 2)
        src.get_samples(len(LABELS) + 2)
    assert len(groups) == len(LABELS) + 2
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1, notes
    assert f"a request for {len(LABELS) + 2} groups is larger than the dataset ({len(LABELS)} prompts)" in notes[0]
    assert "the epoch wraps inside one batch" in notes[0]
