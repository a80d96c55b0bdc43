"""scripts/gpu_check.sh on this CPU machine: every row skipped, exit 0 (on a GPU machine it runs them)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_skips_every_row_without_a_gpu(tmp_path):
    env = dict(os.environ, PY=sys.executable, GPU_CHECK_DIR=str(tmp_path), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "check | result" not in line]
    assert len(rows) >= 6 and all("no GPU: skipped" in row for row in rows)
    assert "GPU check (0 GPU(s)" in proc.stdout


def test_gpu_check_refuses_a_missing_python(tmp_path):
    if not Path("/bin/bash").exists():
        pytest.skip("no bash")
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=dict(os.environ, PY=str(tmp_path / "nope")),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no python at" in proc.stderr
