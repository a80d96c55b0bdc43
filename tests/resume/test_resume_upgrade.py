"""A run dir written by the previous landed version resumes with this one, no opt-in: keys the
project added since and defaults it changed are upgrades (logged at INFO, recorded as
`accepted_by: upgrade`), the user's own changes are still refused (the committed fixture:
tests/fixtures/run_dirs/README.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.sinks.jsonl import read_metrics

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "run_dirs" / "v328523a_smoke"

pytestmark = pytest.mark.timeout(120)


def resume(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HYDRA_FULL_ERROR="1", WANDB_MODE="offline")
    return subprocess.run([sys.executable, "run.py", f"resume={run_dir}", *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=100)


@pytest.fixture
def old_run(tmp_path) -> Path:
    run_dir = tmp_path / "old_run"
    shutil.copytree(FIXTURE, run_dir)
    return run_dir


def test_a_run_dir_of_the_previous_version_resumes_without_an_opt_in(old_run):
    stored = json.loads((old_run / "run_record.json").read_text())["config"]
    assert "trainer.num_workers" not in stored["resume_safe_keys"]  # the fixture predates the key
    proc = resume(old_run, "num_rollout=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in read_metrics(old_run / "metrics.jsonl")] == [0, 1, 2]
    lines = [json.loads(x) for x in (old_run / "config_changes.jsonl").read_text().splitlines()]
    assert [(line["accepted_by"], line["rollout_id"]) for line in lines] == [("upgrade", 2), ("resume_safe_keys", 2)]
    assert "resume_safe_keys" in lines[0]["changes"] and lines[1]["changes"] == {"num_rollout": [2, 3]}
    log = (old_run / "run.log").read_text()
    assert "[INFO] - resume: upgraded to this version's config from rollout 2 on" in log
    assert "[INFO] - resume: config changes from rollout 2 on: num_rollout: 2 -> 3" in log
    assert "[WARNING] - resume" not in log
    record = json.loads((old_run / "run_record.json").read_text())["config"]
    assert "trainer.num_workers" in record["resume_safe_keys"]  # the upgraded list is the run's now


def test_the_users_own_change_of_an_old_run_is_still_refused(old_run):
    proc = resume(old_run, "rollout_temperature=0.5")
    assert proc.returncode != 0
    assert "rollout_temperature: 1.0 -> 0.5" in proc.stderr and "allow_config_change=true" in proc.stderr
    assert "resume_safe_keys" not in proc.stderr.split("Keys a resume may change freely")[0]  # the upgrade is not blamed
    widened = resume(old_run, "rollout_temperature=0.5",
                     "resume_safe_keys=[num_rollout,rollout_temperature]")
    assert widened.returncode != 0 and "resume_safe_keys: [" in widened.stderr
    assert not (old_run / "config_changes.jsonl").exists()
