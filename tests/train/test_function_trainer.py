"""pipeline/train/function.py (`trainer=function`) word for word: the refusals, what the user's
function receives, how its metrics are named, the version it counts and the state it keeps.
Its weight sync (none) and its restore through the pipeline are in test_train_sync.py."""

from __future__ import annotations

import json

import pytest

from pipeline.config.args import SlimeArgs
from pipeline.train import function
from pipeline.train.function import FunctionTrainer

CALLS: list[tuple] = []


def recording_train(args, rollout_id, train_data):
    """A user's train function by dotted path: records what it got, returns slime-style metrics."""
    CALLS.append((args, rollout_id, train_data))
    return {"loss": 0.5, "perf/own": 2.0, 7: 1.0}


def test_no_path_and_no_function_is_refused_word_for_word():
    with pytest.raises(ValueError) as err:
        FunctionTrainer()
    assert str(err.value) == ("trainer=function needs trainer.train_function_path=<pkg.module.train> (your "
                              "train(args, rollout_id, train_data) -> metrics)")
    with pytest.raises(ValueError):
        FunctionTrainer(train_function_path="")


def test_the_function_gets_the_runs_args_the_rollout_id_and_the_train_data():
    CALLS.clear()
    args = SlimeArgs({"seed": 4})
    t = FunctionTrainer(train_function_path="test_function_trainer.recording_train", args=args)
    data = {"tokens": [[1, 2]]}
    metrics = t.train(7, data)
    assert CALLS == [(args, 7, data)] and CALLS[0][0] is args and CALLS[0][2] is data
    # keys without an area go under train/, others (and non-string keys) keep theirs
    assert set(metrics) == {"train/loss", "perf/own", "train/7", "perf/train_time"}
    assert metrics["train/loss"] == 0.5 and metrics["perf/own"] == 2.0 and metrics["train/7"] == 1.0
    assert 0 <= metrics["perf/train_time"] < 5
    assert t.weight_version == 1
    t.train(8, data)
    assert t.weight_version == 2 and [c[1] for c in CALLS] == [7, 8]


def test_the_path_is_loaded_through_the_runs_allowlist_once_bound(monkeypatch):
    seen = []

    def load(path, allowed, key):
        seen.append((path, list(allowed), key))
        return recording_train

    monkeypatch.setattr(function, "load_object", load)
    args = SlimeArgs({"allowed_targets": ["mypkg."], "allowed_targets_extra": ["other."]})
    t = FunctionTrainer(train_function_path="mypkg.train")
    assert seen == []                                   # nothing loaded before the run binds its args
    t.bind_args(args)
    assert seen == [("mypkg.train", ["mypkg.", "other."], "trainer.train_function_path")]
    t.bind_args(args)                                   # loaded once
    assert len(seen) == 1


def test_an_unbound_trainer_loads_its_function_when_it_first_trains(monkeypatch):
    monkeypatch.setattr(function, "load_object", lambda path, allowed, key: recording_train)
    monkeypatch.setattr(function, "allowed_targets", lambda args: ["x."])
    CALLS.clear()
    t = FunctionTrainer(train_function_path="x.train")
    t.train(0, {})
    assert CALLS == [(None, 0, {})]


def test_a_function_given_directly_is_not_loaded(monkeypatch):
    monkeypatch.setattr(function, "load_object", lambda *a: pytest.fail("loaded"))
    t = FunctionTrainer(fn=recording_train, args=SlimeArgs({}))
    assert t.train(0, {})["train/loss"] == 0.5
    CALLS.clear()
    FunctionTrainer(fn=recording_train).train(1, {})  # never bound to a run: args None
    assert CALLS == [(None, 1, {})]


def test_none_is_no_metrics_and_anything_else_is_refused_naming_the_path():
    t = FunctionTrainer(fn=lambda args, rollout_id, data: None)
    assert set(t.train(0, {})) == {"perf/train_time"} and t.weight_version == 1
    bad = FunctionTrainer(train_function_path="mypkg.train", fn=lambda args, rollout_id, data: [1.0])
    with pytest.raises(TypeError) as err:
        bad.train(0, {})
    assert str(err.value) == "trainer function mypkg.train: returned list; expected a dict of metrics or None"
    assert bad.weight_version == 0                      # a failed call is not a version


def test_the_state_is_the_version_and_the_path_and_round_trips(tmp_path):
    t = FunctionTrainer(train_function_path="mypkg.train", fn=recording_train)
    t.train(0, {})
    t.train(1, {})
    assert t.weights_for_engine() is None
    t.save(str(tmp_path))
    assert json.loads((tmp_path / "trainer_state.json").read_text()) == {"weight_version": 2,
                                                                         "train_function_path": "mypkg.train"}
    (tmp_path / "trainer_state.json").write_text(json.dumps({"weight_version": "5", "train_function_path": "a.b"}))
    fresh = FunctionTrainer(fn=recording_train)
    fresh.load(str(tmp_path))
    assert fresh.weight_version == 5 and type(fresh.weight_version) is int
    assert [p.name for p in tmp_path.iterdir()] == ["trainer_state.json"]  # written atomically, no temp left
