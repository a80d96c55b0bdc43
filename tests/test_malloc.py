"""`keep_freed_memory` (pipeline/malloc.py): while a run runs, glibc keeps freed tensors' memory
for reuse, so repeated large allocations stop faulting pages in; its defaults come back after;
the environment wins; pre-flight checks the key."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.malloc import ENV_KEYS, keep_freed_memory, keep_freed_memory_problem

ROOT = Path(__file__).resolve().parents[1]

# a child that allocates, touches and frees a tensor again and again, and prints the minor page
# faults of the last 7 of 10 64 MB tensors (the first ones grow the heap either way) while the
# setting holds, and of 3 256 MB tensors after it (larger than anything glibc kept, so they come
# from mmap again once its defaults are back)
_CHILD = """
import resource, sys, torch
from pipeline.malloc import keep_freed_memory
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def count(mb, warm, counted):
    for _ in range(warm):
        torch.ones(mb * 2**18)
    start = faults()
    for _ in range(counted):
        torch.ones(mb * 2**18)
    return faults() - start
with keep_freed_memory(sys.argv[1] == "keep") as said:
    print(said, file=sys.stderr)
    kept = count(64, 3, 7)
print(kept, count(256, 0, 3))
"""


def _bare_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ENV_KEYS}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_memory_is_reused_without_page_faults() -> None:
    faults = {}
    for mode in ("keep", "default"):
        proc = subprocess.run([sys.executable, "-c", _CHILD, mode], cwd=ROOT, env=_bare_env(), capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        faults[mode], faults[f"{mode}, after the block"] = map(int, proc.stdout.split())
    # 7 x 64 MB in 4 KB pages is 114,688 faults when every block is mapped anew
    assert faults["default"] > 50_000, faults
    assert faults["keep"] < faults["default"] / 20, faults
    # glibc's defaults are back after the block: 3 x 256 MB mapped anew each time, 196,608 faults
    assert faults["keep, after the block"] > 150_000, faults


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_pre_flight_refuses_what_is_not_a_bool(value: object) -> None:
    assert keep_freed_memory_problem(value) == f"keep_freed_memory: expected true or false, got {value!r}"
    with keep_freed_memory(value) as said:
        assert said == f"keep_freed_memory={value!r} not applied (pre-flight checks it)"


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "12")
    with keep_freed_memory(True) as said:
        assert said == "malloc as the environment says (MALLOC_MMAP_MAX_=12); keep_freed_memory not applied"


def test_false_leaves_glibc_as_it_comes() -> None:
    with keep_freed_memory(False) as said:
        assert said == "freed memory goes back to the OS as glibc decides (keep_freed_memory=false)"
    assert keep_freed_memory_problem(False) is None and keep_freed_memory_problem(True) is None


def test_the_run_applies_and_logs_it(tmp_path: Path) -> None:
    """The CLI with no MALLOC_* variable set: the run applies the key and says so in its log."""
    cmd = [sys.executable, "run.py", "engine=scripted", "logger=jsonl", "num_rollout=1",
           f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=_bare_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (tmp_path / "run" / "run.log").read_text()
    assert "freed memory stays in the process for reuse (keep_freed_memory: no mmap, trim above 2 GB)" in log
