"""pipeline/train/build.py: `trainer=policy_gradient` builds the in-process trainer for one worker
and the distributed driver for N, with the same keys and args, sets `keep_states`, and logs the
disk estimate only when the run dir is known. The classes are stand-ins here (what they build is
tested in test_policy_gradient.py and test_distributed_fast.py); one real build of each at the end."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.config.args import SlimeArgs
from pipeline.train import build


class Recorder:
    made: list[tuple[str, Any, dict[str, Any]]] = []

    def __init__(self, *, args: Any = None, **keys: Any) -> None:
        Recorder.made.append((type(self).__name__, args, keys))


class InProcess(Recorder):
    pass


class Driver(Recorder):
    pass


@pytest.fixture
def stand_ins(monkeypatch):
    Recorder.made = []
    disk: list[tuple[dict[str, Any], str]] = []
    monkeypatch.setattr(build, "PolicyGradientTrainer", InProcess)
    monkeypatch.setattr(build, "DistributedTrainer", Driver)
    monkeypatch.setattr(build, "log_disk_estimate", lambda keys, run_dir: disk.append((keys, run_dir)))
    return disk


@pytest.mark.parametrize(("workers", "cls"), [(1, InProcess), (2, Driver), (8, Driver)])
def test_one_worker_trains_in_process_and_more_through_the_driver(stand_ins, workers, cls):
    args = SlimeArgs({"paths": {"output_dir": "/runs/a"}, "seed": 3})
    keys = {"num_workers": workers, "keep_states": "2", "lr": 1e-5}
    trainer = build.policy_gradient_trainer(args=args, **keys)
    assert type(trainer) is cls
    assert Recorder.made == [(cls.__name__, args, keys)]
    assert trainer.keep_states == 2 and type(trainer.keep_states) is int
    assert stand_ins == [(keys, "/runs/a")]


def test_without_a_run_dir_no_disk_estimate_is_logged(stand_ins):
    for args in (None, SlimeArgs({"seed": 1}), SlimeArgs({"paths": None}), SimpleNamespace(paths="/runs/x"),
                 SimpleNamespace(paths={"checkpoint_dir": "/c"})):
        build.policy_gradient_trainer(args=args, num_workers=1, keep_states=1)
    assert stand_ins == []
    assert [a for _, a, _ in Recorder.made][0] is None


def test_the_run_dir_comes_from_the_args_as_dict_or_from_their_attributes():
    assert build._run_dir(None) is None
    assert build._run_dir(SlimeArgs({"paths": {"output_dir": "/runs/b"}})) == "/runs/b"
    assert build._run_dir(SimpleNamespace(paths={"output_dir": "/runs/c"})) == "/runs/c"
    assert build._run_dir(SimpleNamespace(paths={"output_dir": None})) is None
    assert build._run_dir(SimpleNamespace(seed=1)) is None
    assert build._run_dir(SimpleNamespace(paths=["/runs/d"])) is None

    class AsDict:  # an args object answering as_dict() (SlimeArgs does), its attributes unread
        paths = {"output_dir": "/wrong"}

        def as_dict(self) -> dict[str, Any]:
            return {"paths": {"output_dir": "/runs/e"}}

    assert build._run_dir(AsDict()) == "/runs/e"


def test_the_real_classes_are_built():
    """No stand-ins, no args (which would start the workers): one worker is a PolicyGradientTrainer
    (nothing loaded until used), two a DistributedTrainer (no Ray until bound to a run)."""
    from trainer_fixtures import yaml_keys

    from pipeline.train.distributed.driver import DistributedTrainer
    from pipeline.train.policy_gradient import PolicyGradientTrainer

    one = build.policy_gradient_trainer(**yaml_keys(keep_states=3))
    two = build.policy_gradient_trainer(**yaml_keys(num_workers=2, keep_states=1))
    assert type(one) is PolicyGradientTrainer and one.keep_states == 3
    assert type(two) is DistributedTrainer and two.keep_states == 1 and two.group is None
