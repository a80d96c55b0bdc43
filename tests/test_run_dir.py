"""A run dir is one experiment, through the CLI (`python run.py ... engine=scripted`): resume restores
the stored config and refuses other changes unless opted in (recorded), a resumed session writes
into the run's own dir, one writer per run dir (a lock, stale locks taken over), unique run dirs, no
fresh run over a run's checkpoints,
Ctrl-C, invalid commands that leave nothing behind, file modes that honour the umask."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.process.atomic import atomic_write_text
from pipeline.data.checkpoint import read_checkpoint, write_checkpoint
from pipeline.run.overrides import hydra_quoted
from pipeline.config.plugins import ConfigError
from pipeline.run.run_lock import LOCK_FILE
from pipeline.run.run_record import CHANGES_FILE, RECORD_FILE
from pipeline.run.session import interrupt_hint, prepare_argv, resume_target_problem
from pipeline.sinks.jsonl import read_metrics

from tests.sinks import wandb_records  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HYDRA_FULL_ERROR="0", OMP_NUM_THREADS="1")
# the experiment a run starts with; resumes below never repeat it unless they say so
EXPERIMENT = ["experiment=smoke", "advantage=rloo", "rollout_temperature=0.3", "rollout.progress=false",
              "rollout.summary=false"]


def cli(*args: str, ok: bool = True, timeout: int = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=timeout)
    if ok:
        assert proc.returncode == 0, f"run.py {' '.join(args)} failed:\n{proc.stderr[-4000:]}"
    else:
        assert proc.returncode != 0, f"run.py {' '.join(args)} should have failed:\n{proc.stderr[-2000:]}"
    return proc


def start(*args: str, token_delay: float = 0.05) -> subprocess.Popen:
    """A slow run in the background (the scripted engine waits `token_delay` s per token); its
    console (stdout and stderr) in `proc.stdout`."""
    return subprocess.Popen([sys.executable, "run.py", f"engine.token_delay={token_delay}", *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)


def _ctrl_c_as_in_a_terminal() -> None:
    """The run gets SIGINT's default action, as a command typed in a terminal does, even when
    this test session was started in the background (a shell starts background jobs with SIGINT
    ignored, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(cond, what: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, f"the run ended before {what}: {proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]


def has_steps(run_dir: Path) -> bool:
    """metrics.jsonl has a line (read while the run may be appending the next one)."""
    try:
        return bool(steps(run_dir))
    except (OSError, ValueError):
        return False


def stored_config(run_dir: Path) -> dict:
    return json.loads((run_dir / RECORD_FILE).read_text())["config"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> Path:
    """A finished 2-rollout run with rloo advantages and temperature 0.3."""
    run_dir = tmp_path_factory.mktemp("first") / "run"
    cli(*EXPERIMENT, f"hydra.run.dir={run_dir}")
    return run_dir


@pytest.mark.timeout(400)
def test_resume_restores_the_config_and_refuses_other_changes(first_run, tmp_path):
    run_dir = tmp_path / "run"
    os.system(f"cp -r {first_run} {run_dir}")
    log_before = (run_dir / "run.log").read_bytes()
    # the reported case: another estimator, batch and a buffered source on a plain run
    refused = cli("experiment=smoke", f"resume={run_dir}", "num_rollout=4", "advantage=grpo", "rollout_batch_size=4",
                  "data_source=buffered", ok=False)
    for line in ("advantage.estimator: 'rloo' -> 'grpo'", "rollout_batch_size: 2 -> 4",
                 "data_source._target_: 'pipeline.data.sources.PlainDataSource' -> "
                 "'pipeline.data.sources.BufferedDataSource'", "allow_config_change=true"):
        assert line in refused.stderr, refused.stderr[-3000:]
    assert steps(run_dir) == [0, 1] and sorted(p.name for p in (run_dir / ".hydra").iterdir()) == [
        "config.yaml", "hydra.yaml", "overrides.yaml"]  # the refused session left nothing
    assert (run_dir / "run.log").read_bytes() == log_before  # not even a line in the run's log
    # a safe key, without repeating the original overrides (repeating experiment=smoke is no change);
    # an explicit hydra.run.dir is ignored: the resumed session writes into the run dir
    elsewhere = tmp_path / "elsewhere"
    cli(f"resume={run_dir}", "experiment=smoke", "num_rollout=3", f"hydra.run.dir={elsewhere}")
    assert steps(run_dir) == [0, 1, 2] and not elsewhere.exists()
    config = stored_config(run_dir)
    assert config["advantage"]["estimator"] == "rloo" and config["rollout_temperature"] == 0.3
    assert config["num_rollout"] == 3
    sessions = sorted((run_dir / ".hydra").glob("resume-*"))
    assert len(sessions) == 1 and "rollout_temperature=0.3" in (sessions[0] / "overrides.yaml").read_text()
    assert "advantage=rloo" in (run_dir / ".hydra" / "overrides.yaml").read_text()  # the original record kept
    log = (run_dir / "run.log").read_text()
    assert "resume: " in log and "next rollout 2" in log  # the resumed session's log is the run's
    changes = [json.loads(x) for x in (run_dir / CHANGES_FILE).read_text().splitlines()]
    assert changes == [{"rollout_id": 2, "time": changes[0]["time"], "changes": {"num_rollout": [2, 3]},
                        "accepted_by": "resume_safe_keys"}]


@pytest.mark.timeout(400)
def test_opt_in_records_the_change_in_the_run_dir_and_the_wandb_config(first_run, tmp_path):
    """Real part: the offline wandb run records the config update."""
    run_dir = tmp_path / "run"
    os.system(f"cp -r {first_run} {run_dir}")
    cli(f"resume={run_dir}", "num_rollout=3", "advantage=grpo", "allow_config_change=true", "logger=wandb")
    assert steps(run_dir) == [0, 1, 2]
    line = json.loads((run_dir / CHANGES_FILE).read_text().splitlines()[-1])
    assert line["rollout_id"] == 2 and line["accepted_by"] == "allow_config_change=true"
    assert line["changes"]["advantage.estimator"] == ["rloo", "grpo"]
    assert stored_config(run_dir)["advantage"]["estimator"] == "grpo"  # the next resume compares with this
    assert "advantage=grpo" in json.loads((run_dir / RECORD_FILE).read_text())["overrides"]
    wandb_file = next((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    updates = {}
    for record in wandb_records.scan(wandb_file):
        if record.WhichOneof("record_type") == "config":
            updates.update({i.key: json.loads(i.value_json) for i in record.config.update})
    assert updates["advantage"]["estimator"] == "grpo"
    assert updates["config_changes"][-1]["changes"]["advantage.estimator"] == ["rloo", "grpo"]
    # a second resume without the opt-in continues with grpo (the recorded config), no new change
    cli(f"resume={run_dir}", "num_rollout=4")
    assert steps(run_dir) == [0, 1, 2, 3] and stored_config(run_dir)["advantage"]["estimator"] == "grpo"


@pytest.mark.timeout(300)
def test_a_run_dir_of_the_earlier_over_sampling_factor_layout_resumes(first_run, tmp_path):
    """Earlier runs kept over_sampling_factor in data_source / dynamic_filter (the larger one
    counted): their stored config and overrides are read with the top-level key."""
    run_dir = tmp_path / "run"
    os.system(f"cp -r {first_run} {run_dir}")
    record = json.loads((run_dir / RECORD_FILE).read_text())
    config = record["config"]
    assert config.pop("over_sampling_factor") == 1
    config["data_source"]["over_sampling_factor"] = 2
    config["dynamic_filter"]["over_sampling_factor"] = 1
    config["over_sampling_batch_size"] = 4
    record["overrides"].append("data_source.over_sampling_factor=2")
    atomic_write_text(run_dir / RECORD_FILE, json.dumps(record))
    proc = cli(f"resume={run_dir}", "num_rollout=3")
    assert "data_source.over_sampling_factor moved to over_sampling_factor" in proc.stderr
    assert steps(run_dir) == [0, 1, 2]
    config = stored_config(run_dir)
    assert config["over_sampling_factor"] == 2 and config["over_sampling_batch_size"] == 4
    assert "over_sampling_factor" not in config["data_source"]


@pytest.mark.timeout(300)
def test_a_run_dir_of_the_earlier_data_path_layout_resumes(first_run, tmp_path):
    """Earlier runs named the prompt file data_source.path: their stored config and overrides are
    read with data_source.prompt_data, and the old spelling on the command line still works."""
    run_dir = tmp_path / "run"
    os.system(f"cp -r {first_run} {run_dir}")
    record = json.loads((run_dir / RECORD_FILE).read_text())
    data = record["config"]["data_source"].pop("prompt_data")
    record["config"]["data_source"]["path"] = data
    record["overrides"].append(f"data_source.path={data}")
    atomic_write_text(run_dir / RECORD_FILE, json.dumps(record))
    proc = cli(f"resume={run_dir}", "num_rollout=3", f"data_source.path={data}")
    assert "data_source.path moved to data_source.prompt_data (the old key is deprecated)" in proc.stderr
    assert steps(run_dir) == [0, 1, 2]
    config = stored_config(run_dir)
    assert config["data_source"]["prompt_data"] == data and "path" not in config["data_source"]
    assert f"data_source.prompt_data={data}" in json.loads((run_dir / RECORD_FILE).read_text())["overrides"]
    # another file under the old spelling is a change of the experiment, refused as such
    other = data.replace("math_train", "math_eval")
    refused = cli(f"resume={run_dir}", "num_rollout=4", f"data_source.path={other}", ok=False)
    assert f"data_source.prompt_data: '{data}' -> '{other}'" in refused.stderr


@pytest.mark.timeout(300)
def test_an_older_run_dir_without_a_record_resumes_from_its_hydra_files(first_run, tmp_path):
    run_dir = tmp_path / "run"
    os.system(f"cp -r {first_run} {run_dir}")
    (run_dir / RECORD_FILE).unlink()
    cli(f"resume={run_dir}", "num_rollout=3")
    assert steps(run_dir) == [0, 1, 2] and stored_config(run_dir)["advantage"]["estimator"] == "rloo"
    (run_dir / RECORD_FILE).unlink()
    refused = cli(f"resume={run_dir}", "num_rollout=4", "rollout_temperature=1.0", ok=False)
    assert "rollout_temperature: 0.3 -> 1.0" in refused.stderr


@pytest.mark.timeout(400)
def test_two_runs_on_one_dir_and_a_resume_of_a_live_run_fail_at_once(tmp_path):
    run_dir = tmp_path / "run"
    first = start(*EXPERIMENT, "num_rollout=50", f"hydra.run.dir={run_dir}", token_delay=0.2)
    try:
        lock = run_dir / LOCK_FILE
        wait_for(lambda: lock.is_file() and lock.read_text().strip(), "the lock", first)
        # a finished rollout before the Ctrl-C below, so the steps checked after it exist
        wait_for(lambda: has_steps(run_dir), "the first rollout", first)
        holder = f"in use by pid {first.pid} on host {socket.gethostname()}"
        for args in ([*EXPERIMENT, f"hydra.run.dir={run_dir}"], [f"resume={run_dir}", "num_rollout=5"]):
            began = time.monotonic()
            second = cli(*args, ok=False)
            assert holder in second.stderr and time.monotonic() - began < 30, second.stderr[-2000:]
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=60) == 130, first.stdout.read()[-3000:]
    finally:
        first.kill()
    done = steps(run_dir)
    assert done == list(range(len(done)))  # each step once
    assert sorted(p.name for p in (run_dir / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert "num_rollout=50" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert lock.read_text() == ""  # released at exit


@pytest.mark.timeout(400)
def test_a_killed_runs_stale_lock_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(*EXPERIMENT, "num_rollout=4", f"hydra.run.dir={run_dir}")
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "rollout_0.json").exists(), "the first checkpoint", proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == proc.pid  # left behind
    cli(f"resume={run_dir}")
    assert steps(run_dir) == [0, 1, 2, 3] and (run_dir / LOCK_FILE).read_text() == ""
    log = (run_dir / "run.log").read_text()
    assert f"taking over the stale lock {run_dir / LOCK_FILE} of pid {proc.pid}" in log
    assert "no longer running" in log


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("signum", "code", "name"), [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_saves_releases_and_prints_the_resume_command(tmp_path, signum, code, name):
    # SIGTERM (a scheduler's stop, `kill`, `timeout`) stops the run as Ctrl-C does
    run_dir = tmp_path / "run"
    proc = start(*EXPERIMENT, "num_rollout=20", f"hydra.run.dir={run_dir}")
    try:
        wait_for(lambda: has_steps(run_dir), "the first rollout", proc)
        proc.send_signal(signum)
        time.sleep(0.6)
        if proc.poll() is None:  # a second Ctrl-C, as an impatient user presses it: the same clean exit
            proc.send_signal(signum)
        err = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert f"interrupted ({name}): the newest checkpoint is {run_dir}/checkpoints/rollout_" in err
    assert f"python run.py resume={run_dir}" in err
    assert "(save_interval=1: a checkpoint after every rollout)" in err
    done = steps(run_dir)
    newest = max(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("rollout_*.json"))
    assert done == list(range(newest + 1))  # a metrics line for every checkpointed rollout, none beyond
    assert read_checkpoint(run_dir / "checkpoints" / f"rollout_{newest}.json")["rollout_id"] == newest
    assert (run_dir / LOCK_FILE).read_text() == ""
    cli(f"resume={run_dir}", f"num_rollout={newest + 3}")
    assert steps(run_dir) == list(range(newest + 3))


def test_the_interrupt_hint_says_how_often_checkpoints_are_written(tmp_path):
    # experiment=learn checkpoints every 10th rollout: a Ctrl-C at rollout 7 keeps nothing, and says why
    hint = interrupt_hint(str(tmp_path), 10)
    assert hint.startswith("interrupted (Ctrl-C) before the first checkpoint (save_interval=10: a checkpoint "
                           "after every 10th rollout); nothing to resume in ")
    assert hint.endswith("start the run again, with a smaller save_interval to keep more of an interrupted run")
    assert interrupt_hint(str(tmp_path), 1).endswith("start the run again")
    assert "(save_interval=null: a checkpoint after the last rollout only)" in interrupt_hint(str(tmp_path), None)
    (tmp_path / "checkpoints").mkdir()
    for rollout_id in (9, 19):
        (tmp_path / "checkpoints" / f"rollout_{rollout_id}.json").write_text("{}")
    (tmp_path / "checkpoints" / "rollout_29.json.tmp").write_text("")  # a half-written one is not a checkpoint
    hint = interrupt_hint(str(tmp_path), 2)
    assert f"the newest checkpoint is {tmp_path}/checkpoints/rollout_19.json (save_interval=2: a checkpoint " \
           "after every 2nd rollout); rollouts after it" in hint
    assert hint.endswith(f"Continue with:\n  python run.py resume={tmp_path}")
    assert "after every 21st rollout" in interrupt_hint(str(tmp_path), 21)
    assert "after every 12th rollout" in interrupt_hint(str(tmp_path), 12)


@pytest.mark.timeout(300)
def test_invalid_commands_leave_nothing_and_run_dirs_are_unique(tmp_path):
    bad = tmp_path / "bad"
    refused = cli(*EXPERIMENT, "num_rollout=0", f"hydra.run.dir={bad}", ok=False)
    assert "num_rollout" in refused.stderr and not bad.exists()
    # from another folder, into the default outputs/runs/<time>: no empty outputs/runs/ left there
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").mkdir()
    away = subprocess.run([sys.executable, str(ROOT / "run.py"), *EXPERIMENT, "num_rollout=0"], cwd=elsewhere, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert away.returncode != 0 and "num_rollout" in away.stderr
    assert [p.name for p in elsewhere.iterdir()] == ["keep"]
    sweep = tmp_path / "sweep"
    cli("-m", *EXPERIMENT, "num_rollout=0", f"hydra.sweep.dir={sweep}", ok=False)
    assert not (sweep / "0").exists()
    # two runs started at once with the same dir name get two dirs
    same = "hydra.run.dir=${unique_dir:" + str(tmp_path / "runs" / "same") + "}"
    procs = [subprocess.Popen([sys.executable, "run.py", *EXPERIMENT, same], cwd=ROOT, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=200) == 0, p.stderr.read()[-3000:]  # (progress off: stdout stays small)
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["same", "same_2"]
    for name in runs:
        assert steps(tmp_path / "runs" / name) == [0, 1]


@pytest.mark.timeout(400)
def test_a_fresh_run_into_a_dir_holding_a_run_is_refused_and_leaves_it_as_it_was(tmp_path):
    """The same command twice with one explicit hydra.run.dir: the second would have truncated the
    first run's metrics, pruned its checkpoints and overwritten its record and Hydra files; it is
    refused before anything is written, and the two ways on it prints run as printed, also for a
    dir whose name Hydra's grammar needs quoted (a space, an accent, a quote)."""
    run_dir = tmp_path / "my runs" / "café l'été"
    cli(*EXPERIMENT, f"hydra.run.dir={hydra_quoted(str(run_dir))}")
    kept = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    refused = cli(*EXPERIMENT, "num_rollout=3", f"hydra.run.dir={hydra_quoted(str(run_dir))}", ok=False)
    assert f"hydra.run.dir={run_dir} already holds a run (newest checkpoint: rollout 1)" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == kept  # .hydra/ and run.log too
    resume = refused.stderr.split("Continue that run with\n  python run.py ", 1)[1].split("\n", 1)[0]
    beside = refused.stderr.split("beside it with ", 1)[1].split(" (the first free", 1)[0]
    cli(*shlex.split(resume), "num_rollout=3")
    assert steps(run_dir) == [0, 1, 2]
    cli(*EXPERIMENT, *shlex.split(beside))
    assert steps(run_dir.parent / f"{run_dir.name}_2") == [0, 1]
    cli(f"resume={run_dir}", "num_rollout=4")  # typed without Hydra's quotes: taken as the path
    assert steps(run_dir) == [0, 1, 2, 3]
    # a sweep into a sweep dir whose jobs have checkpoints
    sweep = tmp_path / "sweep"
    cli("-m", *EXPERIMENT, "num_rollout=1", "data_source.seed=1,2", f"hydra.sweep.dir={sweep}")
    kept = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    refused = cli("-m", *EXPERIMENT, "num_rollout=1", "data_source.seed=1,2", f"hydra.sweep.dir={sweep}", ok=False)
    assert f"hydra.sweep.dir={sweep} already holds a sweep (jobs with checkpoints: 0, 1)" in refused.stderr
    assert f"Continue that sweep with\n  python run.py resume={sweep}\n" in refused.stderr
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == kept


def test_a_run_stopped_before_its_first_checkpoint_is_started_again_by_the_same_command(tmp_path):
    """Nothing to continue there (the Ctrl-C message says to start the run again): not refused."""
    early = tmp_path / "early"
    (early / "checkpoints").mkdir(parents=True)
    (early / "checkpoints" / "rollout_9.json.tmp").write_text("")  # a half-written one is not a checkpoint
    (early / "metrics.jsonl").write_text("")
    argv = ["run.py", "experiment=smoke", f"hydra.run.dir={early}"]
    assert prepare_argv(argv) == argv
    (early / "checkpoints" / "rollout_9.json").write_text("{}")
    with pytest.raises(ConfigError, match=rf"hydra.run.dir={early} already holds a run \(newest checkpoint: rollout 9"):
        prepare_argv(argv)


def test_a_run_or_sweep_dir_at_or_under_a_file_is_refused_before_hydra_writes(tmp_path):
    (tmp_path / "afile").write_text("notes")
    for argv in (["run.py", f"hydra.run.dir={tmp_path}/afile"], ["run.py", f"hydra.run.dir={tmp_path}/afile/run"],
                 ["run.py", "-m", "data_source.seed=1,2", f"hydra.sweep.dir={tmp_path}/afile"]):
        with pytest.raises(ConfigError, match=f"{tmp_path}/afile is a file, not a folder; the run writes its files "
                                              f"into a folder: choose another path"):
            prepare_argv(argv)
    assert (tmp_path / "afile").read_text() == "notes"
    assert prepare_argv(["run.py", f"hydra.run.dir={tmp_path}/new/run"])[-1] == f"hydra.run.dir={tmp_path}/new/run"


def test_paths_output_dir_points_hydra_there_too_so_run_log_is_beside_the_runs_files(tmp_path):
    """`paths.output_dir=X` of a fresh run becomes `hydra.run.dir=X` before Hydra starts: its
    run.log and .hydra/ are in X, nothing is written under the launch dir's outputs/, and the
    closing line's log is there."""
    out = tmp_path / "my run"
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), *EXPERIMENT, "rollout.summary=true",
                           f"paths.output_dir={out}"], cwd=tmp_path, env=dict(ENV, PROJECT_ROOT=str(ROOT)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "run.log").is_file() and (out / ".hydra" / "config.yaml").is_file() and steps(out) == [0, 1]
    assert f"Run dir: {out} (full log: run.log)" in proc.stdout
    assert not (tmp_path / "outputs").exists()
    # the second command is refused by the key the user typed, and the unique_dir form it offers works
    refused = subprocess.run([sys.executable, str(ROOT / "run.py"), *EXPERIMENT, f"paths.output_dir={out}"],
                             cwd=tmp_path, env=dict(ENV, PROJECT_ROOT=str(ROOT)), capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 1 and f"paths.output_dir={out} already holds a run" in refused.stderr
    beside = refused.stderr.split("beside it with ", 1)[1].split(" (the first free", 1)[0]
    again = subprocess.run([sys.executable, str(ROOT / "run.py"), *EXPERIMENT, *shlex.split(beside)], cwd=tmp_path,
                           env=dict(ENV, PROJECT_ROOT=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    beside_dir = tmp_path / "my run_2"
    assert (beside_dir / "run.log").is_file() and steps(beside_dir) == [0, 1] and not (tmp_path / "outputs").exists()


def test_paths_output_dir_and_hydra_run_dir_must_name_one_dir(tmp_path):
    out = f"{tmp_path}/out"
    assert prepare_argv(["run.py", "a=1", f"paths.output_dir={out}", "b=2"]) == ["run.py", "a=1", "b=2",
                                                                               f"hydra.run.dir={out}"]
    same = ["run.py", f"paths.output_dir={out}/", f"hydra.run.dir={out}"]
    assert prepare_argv(same) == same
    for other in (f"hydra.run.dir={tmp_path}/elsewhere", "hydra.run.dir=${unique_dir:" + out + "}"):
        with pytest.raises(ConfigError, match=r"paths.output_dir=.* and hydra.run.dir=.* name two dirs: the run "
                                              r"writes its files into paths.output_dir and Hydra its run.log"):
            prepare_argv(["run.py", f"paths.output_dir={out}", other])
    # a sweep's jobs would all write into one plain paths.output_dir: refused, naming the sweep dir to use
    with pytest.raises(ConfigError, match=re.escape(f"paths.output_dir={out} in a sweep: every job would write into "
                                                    f"that one dir") + ".*" + re.escape(f"hydra.sweep.dir={out}, where "
                                                                                        f"job <n> writes into <dir>/<n>")):
        prepare_argv(["run.py", "-m", f"paths.output_dir={out}", "data_source.seed=1,2"])
    # left as they are: a sweep over the dir, one dir per job by interpolation, a value built on Hydra's dir
    for argv in (["run.py", "-m", f"paths.output_dir={out}/a,{out}/b"],
                 ["run.py", "-m", "paths.output_dir=" + out + "/${hydra:job.num}", "data_source.seed=1,2"],
                 ["run.py", "paths.output_dir=${hydra:runtime.output_dir}/sub"]):
        assert prepare_argv(argv) == argv
    assert not Path(out).exists()


def test_resume_of_a_sweep_dir_lists_its_jobs_and_a_read_only_dir_says_what_to_do(tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    for job, seed in (("0", 1), ("1", 2)):
        (sweep / job / ".hydra").mkdir(parents=True)
        (sweep / job / ".hydra" / "overrides.yaml").write_text(f"- data_source.seed={seed}\n")
    (sweep / "multirun.yaml").write_text("{}\n")
    msg = resume_target_problem(str(sweep))  # run(cfg) with resume=<sweep dir>: one job at a time
    assert "is a sweep dir" in msg and f"resume={sweep / '0'}  (data_source.seed=1)" in msg
    assert f"resume={sweep / '1'}  (data_source.seed=2)" in msg and f"python run.py resume={sweep} continues" in msg
    msg = cli(f"resume={sweep}", ok=False).stderr  # the command line continues the sweep: its record is needed
    assert f"resume: {sweep / 'multirun.yaml'} cannot be read as Hydra's sweep record" in msg
    assert not list(sweep.glob("*/run.lock"))

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("tempfile.TemporaryFile", read_only)
    problem = resume_target_problem(str(sweep / "0"))
    assert problem is not None and f"the run dir {str(sweep / '0')!r} is not writable (Read-only file system)" in problem
    assert "cp -r" in problem


@pytest.mark.timeout(400)
def test_a_sweep_stopped_in_its_second_job_is_continued_whole_by_resume_of_its_dir(tmp_path):
    """Ctrl-C in job 1 of 3: the message names the sweep; `resume=<sweep dir> num_rollout=4`
    extends the finished job 0, continues job 1 from its checkpoint and runs job 2 from the start."""
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "run.py", "-m", *EXPERIMENT, "engine.token_delay=0.02", "num_rollout=3",
                             "data_source.seed=1,2,3", f"hydra.sweep.dir={sweep}"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        wait_for(lambda: (sweep / "1" / "checkpoints" / "rollout_0.json").exists(), "job 1's first checkpoint", proc)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in out, out[-3000:]
    assert f"Continue the whole sweep (this job from its newest checkpoint, the jobs after it from the start) " \
           f"with:\n  python run.py resume={sweep}" in out
    assert steps(sweep / "0") == [0, 1, 2] and not (sweep / "2").exists()
    stopped_at = len(steps(sweep / "1"))
    refused = cli(f"resume={sweep}", "data_source.seed=4,5", ok=False)
    assert "'data_source.seed=4,5' changes the sweep's jobs" in refused.stderr
    cli(f"resume={sweep}", "num_rollout=4")
    for job in ("0", "1", "2"):
        assert steps(sweep / job) == [0, 1, 2, 3], job
    log = (sweep / "1" / "run.log").read_text()
    assert f"resume: {sweep / '1'} from checkpoint {stopped_at - 1}" in log or \
        f"resume: {sweep / '1'} from checkpoint {stopped_at - 2}" in log
    assert json.loads((sweep / "0" / CHANGES_FILE).read_text())["changes"] == {"num_rollout": [3, 4]}
    assert not any("continue_sweep" in o for o in json.loads((sweep / "2" / RECORD_FILE).read_text())["overrides"])
    for job in ("0", "1"):  # the first session's Hydra files are kept
        assert "num_rollout=3" in (sweep / job / ".hydra" / "overrides.yaml").read_text()
    assert (sweep / "summary.md").read_text().count("data_source.seed=") >= 3


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only dirs")
def test_resume_into_a_read_only_dir_through_the_cli(first_run, tmp_path):
    run_dir = tmp_path / "run"
    os.system(f"cp -r {first_run} {run_dir} && chmod -R a-w {run_dir}")
    try:
        msg = cli(f"resume={run_dir}", "num_rollout=3", ok=False).stderr
    finally:
        os.system(f"chmod -R u+w {run_dir}")
    assert "is not writable" in msg and "Traceback" not in msg


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_honour_the_umask(tmp_path, umask):
    from pipeline.samples.sample import Sample
    from pipeline.sinks.files import write_samples, write_train_data

    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        write_samples(tmp_path / "samples.jsonl", [Sample(prompt="p", index=0)])
        write_train_data(tmp_path / "td", {"tokens": [[1, 2]]})
        write_checkpoint(tmp_path / "rollout_0.json", {"rollout_id": 0})
        with open(tmp_path / "plain.txt", "w") as fh:
            fh.write("x")
    finally:
        os.umask(old)
    expected = 0o666 & ~umask
    for name in ("a.txt", "samples.jsonl", "td.safetensors", "td.json", "rollout_0.json", "plain.txt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == expected, name


def test_resume_of_a_sweep_dir_reruns_its_stored_sweep_into_it(tmp_path):
    """The command line a sweep resume hands Hydra: the stored task and launcher overrides, the new
    ones after them, continue_sweep, the same sweep dir and this session's Hydra subfolder."""
    sweep = tmp_path / "sw"
    (sweep / "0" / ".hydra").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    hydra: [hydra.sweep.dir=/old/place, hydra.mode=MULTIRUN, hydra/launcher=ray]\n"
        "    task: [experiment=smoke, 'data_source.seed=1,2', num_rollout=3]\n")
    argv = prepare_argv(["run.py", f"resume={sweep}", "num_rollout=5", "hydra.verbose=true"])
    assert argv[:6] == ["run.py", "-m", "experiment=smoke", "data_source.seed=1,2", "num_rollout=5",
                        "continue_sweep=true"]
    assert argv[6:9] == ["hydra/launcher=ray", "hydra.verbose=true", f"hydra.sweep.dir={sweep}"]
    assert argv[9].startswith("hydra.output_subdir=.hydra/resume-") and len(argv) == 10
    assert not (sweep / "0" / LOCK_FILE).exists()  # checked, not held: each job locks its own dir
    with pytest.raises(ConfigError, match=r"'data_source.seed=2' sets a key this sweep sweeps \(data_source.seed=1,2\)"):
        prepare_argv(["run.py", f"resume={sweep}", "data_source.seed=2"])  # would renumber the jobs
    with pytest.raises(ConfigError, match=r"'data_source.seed=3,4' changes the sweep's jobs"):
        prepare_argv(["run.py", f"resume={sweep}", "data_source.seed=3,4"])
