"""pipeline/run/fresh_run.py on its own (no subprocess): which explicit dirs a fresh run or sweep
may take, the messages that refuse the others word for word, and `paths.output_dir` pointing
Hydra at the run's dir. The CLI side is in tests/test_run_dir.py."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
from pathlib import Path

import pytest

from pipeline.config.plugins import ConfigError
from pipeline.run.fresh_run import (checkpoint_ids, existing_run_problem, fresh_target_problem, has_checkpoint,
                                    is_override, output_dir_as_run_dir, override_values)
from pipeline.run.run_lock import LOCK_FILE, RunDirLocked, acquire, release


def _checkpointed(run_dir: Path, *rollout_ids: int) -> Path:
    (run_dir / "checkpoints").mkdir(parents=True)
    for rollout_id in rollout_ids:
        (run_dir / "checkpoints" / f"rollout_{rollout_id}.json").write_text("{}")
    return run_dir


def test_overrides_and_their_values_as_hydra_reads_them():
    assert [is_override(a) for a in ("a=1", "+a=1", "~a", "-m", "--cfg", "job", "--config-name=other")] == [
        True, True, True, False, False, False, False]
    args = ["a=1", "-m", "+b=x", "a='two words'", "~a", "b.c=3"]  # a deletion `~a` has no value
    assert override_values(args, "a") == ["1", "two words"]
    assert override_values(args, "b") == ["x"] and override_values(args, "c") == []


def test_complete_checkpoints_count_and_half_written_ones_do_not(tmp_path):
    assert checkpoint_ids(tmp_path) == [] and not has_checkpoint(str(tmp_path))
    run_dir = _checkpointed(tmp_path / "run", 3, 1)
    (run_dir / "checkpoints" / "rollout_9.json.tmp").write_text("")
    assert sorted(checkpoint_ids(run_dir)) == [1, 3] and has_checkpoint(str(run_dir))


def test_a_dir_holding_a_run_is_refused_with_the_commands_that_go_on(tmp_path):
    assert existing_run_problem(str(tmp_path / "new")) is None
    run_dir = _checkpointed(tmp_path / "run", 0, 4)
    assert existing_run_problem(str(run_dir), "paths.output_dir") == (
        f"paths.output_dir={run_dir} already holds a run (newest checkpoint: rollout 4); a fresh run there would "
        f"truncate its metrics.jsonl, prune its checkpoints and overwrite its record. Continue that run with\n"
        f"  python run.py resume={run_dir}\nor start a new one beside it with "
        f"'paths.output_dir=${{unique_dir:{run_dir}}}' (the first free run_2, run_3, ...) or another dir, or "
        f"delete {run_dir} to start over")
    assert existing_run_problem(str(run_dir)).startswith(f"hydra.run.dir={run_dir} already holds a run")


def test_an_explicit_run_dir_is_checked_by_the_key_the_user_typed(tmp_path):
    assert fresh_target_problem(["a=1"]) is None
    assert fresh_target_problem([f"hydra.run.dir={tmp_path}/new"]) is None
    (tmp_path / "afile").write_text("notes")
    assert fresh_target_problem([f"hydra.run.dir={tmp_path}/afile"]).startswith(f"hydra.run.dir={tmp_path}/afile: ")
    assert fresh_target_problem([f"hydra.run.dir={tmp_path}/afile/run"], "paths.output_dir") == (
        f"paths.output_dir={tmp_path}/afile/run: {tmp_path}/afile is a file, not a folder; the run writes its "
        f"files into a folder: choose another path")
    run_dir = _checkpointed(tmp_path / "run", 2)
    problem = fresh_target_problem([f"hydra.run.dir={tmp_path}/other", f"hydra.run.dir={run_dir}"], "paths.output_dir")
    assert problem is not None and problem.startswith(f"paths.output_dir={run_dir} already holds a run")


def test_a_live_runs_dir_is_refused_at_once(tmp_path):
    run_dir = tmp_path / "live"
    run_dir.mkdir()
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:  # another writer holds the lock, as a live run does
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps({"pid": 4242, "host": socket.gethostname()}).encode())
        with pytest.raises(RunDirLocked, match=f"run dir {run_dir} is in use by pid 4242"):
            fresh_target_problem([f"hydra.run.dir={run_dir}"])
    finally:
        os.close(fd)


def test_a_stale_lock_is_taken_over_and_its_notice_waits_for_the_runs_log(tmp_path, caplog):
    """A killed run's lock is taken over before Hydra starts; the warning is logged at the run's own
    acquire, once its run.log exists, not lost before it."""
    run_dir = tmp_path / "stale"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).write_text(json.dumps({"pid": 2**22 + 7, "host": socket.gethostname()}))
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.run.run_lock"):
            assert fresh_target_problem([f"hydra.run.dir={run_dir}"]) is None
            assert not [r for r in caplog.records if "stale lock" in r.getMessage()]
            acquire(run_dir)  # the run's own, once its log is set up
        assert [r.getMessage() for r in caplog.records if "taking over the stale lock" in r.getMessage()]
    finally:
        release(run_dir)


def test_a_sweep_dir_is_refused_when_its_jobs_hold_runs_unless_the_sweep_continues(tmp_path):
    sweep = tmp_path / "sweep"
    assert fresh_target_problem(["-m", "a=1,2"]) is None
    assert fresh_target_problem(["-m", f"hydra.sweep.dir={sweep}"]) is None
    for job in ("0", "1"):
        _checkpointed(sweep / job, 0)
        (sweep / job / ".hydra").mkdir()
        (sweep / job / ".hydra" / "overrides.yaml").write_text(f"- a={job}\n")
    (sweep / "multirun.yaml").write_text("{}\n")
    problem = fresh_target_problem(["--multirun", f"hydra.sweep.dir={sweep}"])
    assert problem == (
        f"hydra.sweep.dir={sweep} already holds a sweep (jobs with checkpoints: 0, 1); a new sweep there would "
        f"overwrite its jobs. Continue that sweep with\n  python run.py resume={sweep}\nor start a new one beside "
        f"it with 'hydra.sweep.dir=${{unique_dir:{sweep}}}' or another dir")
    assert fresh_target_problem(["-m", f"hydra.sweep.dir={sweep}", "continue_sweep=true"]) is None
    (tmp_path / "afile").write_text("")
    assert fresh_target_problem(["-m", f"hydra.sweep.dir={tmp_path}/afile", "continue_sweep=true"]) == (
        f"hydra.sweep.dir={tmp_path}/afile: {tmp_path}/afile is a file, not a folder; the run writes its files into "
        f"a folder: choose another path")


def test_paths_output_dir_becomes_hydras_run_dir(tmp_path):
    out = f"{tmp_path}/out"
    argv = ["run.py", "a=1"]
    assert output_dir_as_run_dir(argv) == (argv, "hydra.run.dir")
    assert output_dir_as_run_dir(["run.py", f"paths.output_dir={tmp_path}/first", f"+paths.output_dir={out}", "b=2"]) \
        == (["run.py", "b=2", f"hydra.run.dir={out}"], "paths.output_dir")
    assert output_dir_as_run_dir(["run.py", f"paths.output_dir={tmp_path}/lr=1e-5"]) == (
        ["run.py", f"hydra.run.dir={tmp_path}/lr=1e-5"], "paths.output_dir")  # all the text after the first `=`
    quoted = "paths.output_dir='" + out + " x'"  # the value as typed, quotes included, goes on to Hydra
    assert output_dir_as_run_dir(["run.py", quoted]) == (["run.py", f"hydra.run.dir='{out} x'"], "paths.output_dir")
    same = ["run.py", f"paths.output_dir={out}/", f"hydra.run.dir={out}"]
    assert output_dir_as_run_dir(same) == (same, "hydra.run.dir")
    built = ["run.py", "paths.output_dir=${hydra:runtime.output_dir}/sub"]
    assert output_dir_as_run_dir(built) == (built, "hydra.run.dir")
    for run_dir in (f"{tmp_path}/elsewhere", "${unique_dir:" + out + "}"):
        with pytest.raises(ConfigError) as err:
            output_dir_as_run_dir(["run.py", f"paths.output_dir={out}", f"hydra.run.dir={run_dir}"])
        assert str(err.value) == (f"paths.output_dir={out} and hydra.run.dir={run_dir} name two dirs: the run "
                                  f"writes its files into paths.output_dir and Hydra its run.log and .hydra/ into "
                                  f"hydra.run.dir; give one of them (either one sets both)")
    twice = "${unique_dir:" + out + "}"  # the same text, but each resolves to a dir of its own
    with pytest.raises(ConfigError, match="name two dirs"):
        output_dir_as_run_dir(["run.py", f"paths.output_dir={twice}", f"hydra.run.dir={twice}"])


def test_a_sweep_into_one_plain_output_dir_is_refused(tmp_path):
    out = f"{tmp_path}/out dir"
    with pytest.raises(ConfigError) as err:
        output_dir_as_run_dir(["run.py", "--multirun", f"paths.output_dir={out}", "a=1,2"])
    assert str(err.value) == (f"paths.output_dir={out} in a sweep: every job would write into that one dir (the "
                              f"second finding the first's checkpoints); set the sweep's dir instead, "
                              f"'hydra.sweep.dir=\"{out}\"', where job <n> writes into <dir>/<n>")
    for argv in (["run.py", "-m", f"paths.output_dir={tmp_path}/a,{tmp_path}/b"],
                 ["run.py", "-m", "paths.output_dir=" + out + "/${hydra:job.num}", "a=1,2"]):
        assert output_dir_as_run_dir(argv) == (argv, "hydra.run.dir")
    assert not Path(out).exists() and not re.search("out", " ".join(os.listdir(tmp_path)))
