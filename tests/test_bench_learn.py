"""bench/learn.py's sweep dir: a `hydra.sweep.dir=` the user passes after `--` is where the jobs
write, so the bench reads its results from there (it used to add its own dir first, run.py took
the user's, and the bench then failed reading an empty dir after a 60-minute sweep)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench_learn():
    spec = importlib.util.spec_from_file_location("bench_learn", ROOT / "bench" / "learn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_a_given_sweep_dir_wins_and_is_resolved_against_the_repository(tmp_path):
    learn = _bench_learn()
    assert learn.sweep_dir(["num_rollout=45", "hydra.sweep.dir=outputs/mine"]) == ROOT / "outputs" / "mine"
    assert learn.sweep_dir([f"hydra.sweep.dir={tmp_path}", f"hydra.sweep.dir={tmp_path / 'b'}"]) == tmp_path / "b"
    default = learn.sweep_dir(["num_rollout=45"])
    assert default.parent == ROOT / "outputs" / "bench_learn" and default.name[:2] == "20"
