"""Console output of a run: progress lines, the end-of-run table, no library INFO, useful warnings."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.process.logging_setup import NOISY_LOGGERS, ConsoleFilter, RunProgress, configure_console

ROOT = Path(__file__).resolve().parents[1]


def record(name: str, level: int) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "msg", (), None)


def test_console_filter_keeps_progress_and_warnings_only():
    f = ConsoleFilter()
    assert f.filter(record("pipeline.progress", logging.INFO))
    assert f.filter(record("httpx", logging.WARNING)) and f.filter(record("pipeline.run.app", logging.ERROR))
    assert not f.filter(record("pipeline.rollout.train_run", logging.INFO))
    assert not f.filter(record("ray", logging.INFO))


def test_configure_console_touches_only_hydras_console_handler():
    root = logging.getLogger()
    console, other = logging.StreamHandler(), logging.StreamHandler()
    console.set_name("console")
    root.addHandler(console)
    root.addHandler(other)
    try:
        configure_console()
        configure_console()  # idempotent
        assert sum(isinstance(f, ConsoleFilter) for f in console.filters) == 1
        assert not other.filters
        assert all(logging.getLogger(n).level == logging.WARNING for n in NOISY_LOGGERS)
    finally:
        root.removeHandler(console)
        root.removeHandler(other)


def test_progress_line_and_summary(tmp_path, caplog):
    progress = RunProgress(num_rollout=20, run_dir=str(tmp_path))
    with caplog.at_level(logging.INFO, logger="pipeline.progress"):
        for i in range(20):
            progress.step(i, {"rollout/raw_reward": i / 20, "rollout/pass_rate": 0.5, "perf/rollout_time": 1.0,
                              "eval/gsm": 0.25})
    assert caplog.messages[3] == ("rollout  3 of 0..19 | reward 0.150 | pass 50% | len - | dropped - | buffer - "
                                  "| time s 1.00 | eval/gsm 0.250")
    summary = progress.summary()
    rows = [line for line in summary.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [r.split("|")[1].strip() for r in rows] == [str(i) for i in range(8, 20)]
    assert "(8 earlier rollouts: see metrics.jsonl)" in summary and "mean reward 0.475" in summary
    assert f"python -m pipeline.report {tmp_path}" in summary


@pytest.mark.timeout(120)
def test_cli_console_and_the_nothing_to_run_warning(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "run.py", "experiment=smoke"]
    first = subprocess.run(cmd + [f"hydra.run.dir={run}"], cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert first.returncode == 0, first.stderr
    lines = [line for line in first.stdout.splitlines() if line.strip()]
    assert lines[0] == f"run dir {run}: rollouts 0..1"
    assert [bool(re.match(r"rollout \d of 0\.\.1 \| reward \d\.\d{3} \| pass \d+%", x)) for x in lines[1:3]] == [True] * 2
    assert not any(re.search(r"\]\[(INFO|DEBUG)\]|\bINFO\b", x) for x in lines), first.stdout
    assert "INFO" in (run / "run.log").read_text()  # the details still go to the file
    again = subprocess.run(cmd + [f"resume={run}", f"hydra.run.dir={tmp_path / 'again'}"], cwd=ROOT,
                           capture_output=True, text=True, timeout=100)
    assert again.returncode == 0, again.stderr
    assert "nothing to run" in again.stdout and "num_rollout=4" in again.stdout


def test_a_trainer_s_loss_grad_norm_and_lr_are_on_the_line_and_in_the_summary(tmp_path, caplog):
    progress = RunProgress(num_rollout=3, run_dir=str(tmp_path))
    trained = {"rollout/raw_reward": 0.5, "train/loss": -0.01234, "train/grad_norm": 1.5, "train/lr": 1e-6}
    with caplog.at_level(logging.INFO, logger="pipeline.progress"):
        progress.step(0, {"rollout/raw_reward": 0.25})  # no trainer step in this rollout (e.g. skipped)
        progress.step(1, trained)
        progress.step(2, {**trained, "train/loss": float("nan")})
    assert caplog.messages[0].endswith("| time s -")  # no trainer: no trainer columns
    assert caplog.messages[1].endswith("| time s - | loss -0.0123 | grad norm 1.500 | lr 1.00e-06")
    assert caplog.messages[2].endswith("| loss - | grad norm 1.500 | lr 1.00e-06")
    summary = progress.summary().splitlines()
    assert summary[0] == "| rollout | reward | pass | len | dropped | buffer | time s | loss | grad norm | lr |"
    assert summary[2].startswith("| 0 | 0.250 |") and summary[2].endswith("| - | - | - |")
    assert summary[3].endswith("| -0.0123 | 1.500 | 1.00e-06 |")


def test_rays_signal_handler_notice_is_kept_off_the_console():
    configure_console()
    configure_console()  # idempotent: one filter
    ray_worker = logging.getLogger("ray._private.worker")
    assert sum(type(f).__name__ == "_RaySignalNotice" for f in ray_worker.filters) == 1
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    ray_worker.addHandler(handler)
    try:
        ray_worker.warning("SIGTERM handler is not set because current thread is not the main thread.")
        ray_worker.warning("some other Ray warning")
    finally:
        ray_worker.removeHandler(handler)
    assert seen == ["some other Ray warning"]


def test_the_closing_line_names_the_log_file_where_it_is(tmp_path, monkeypatch):
    """`run.log` when the log file is in the run dir, its whole path when it is elsewhere (a
    sweep job's paths.output_dir), no mention when no file takes the log."""
    run_dir, elsewhere = tmp_path / "run", tmp_path / "hydra"
    run_dir.mkdir()
    elsewhere.mkdir()
    progress = RunProgress(num_rollout=1, run_dir=str(run_dir))
    progress.step(0, {"rollout/raw_reward": 0.5})
    root = logging.getLogger()
    # without the log files earlier tests of this session may have left on the root logger
    monkeypatch.setattr(root, "handlers", [h for h in root.handlers if not isinstance(h, logging.FileHandler)])
    assert f"Run dir: {run_dir}\n" in progress.summary() and "full log" not in progress.summary()
    for folder, shown in ((run_dir, "run.log"), (elsewhere, str(elsewhere / "run.log"))):
        handler = logging.FileHandler(folder / "run.log")
        root.addHandler(handler)
        try:
            assert f"Run dir: {run_dir} (full log: {shown})\n" in progress.summary()
        finally:
            root.removeHandler(handler)
            handler.close()
