"""`omp_spin_count` (pipeline/process/openmp.py): which environment the run sets before torch loads, and
that a thread gives its OpenMP workers back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

import pytest
import torch

from pipeline.process import openmp
from pipeline.process.openmp import ENV_KEYS, configure_openmp_wait, release_thread_workers

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No OpenMP wait variables, nothing set by an earlier call, and torch not (yet) loaded as
    far as the function can tell."""
    _unset_restoring(monkeypatch)
    monkeypatch.setattr(openmp, "_APPLIED", {})
    monkeypatch.delitem(sys.modules, "torch")
    return monkeypatch


def _unset_restoring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset ENV_KEYS so that the test's own settings are undone afterwards too (a plain
    delenv of an absent variable records nothing to restore)."""
    for key in ENV_KEYS:
        monkeypatch.setenv(key, "placeholder")
        monkeypatch.delenv(key)


def test_a_spin_count_sets_gomp_spincount(bare_env: pytest.MonkeyPatch) -> None:
    line = configure_openmp_wait(2500)
    assert os.environ["GOMP_SPINCOUNT"] == "2500" and "OMP_WAIT_POLICY" not in os.environ
    assert "spin 2500 iterations" in line


def test_zero_sleeps_at_once(bare_env: pytest.MonkeyPatch) -> None:
    line = configure_openmp_wait(0)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ
    assert line == "OpenMP threads sleep as soon as an op ends (omp_spin_count=0: OMP_WAIT_POLICY=PASSIVE)"


def test_both_variables_in_the_environment_are_named(bare_env: pytest.MonkeyPatch) -> None:
    bare_env.setenv("OMP_WAIT_POLICY", "ACTIVE")
    bare_env.setenv("GOMP_SPINCOUNT", "7")
    assert configure_openmp_wait(10000) == ("OpenMP threads wait as the environment says (GOMP_SPINCOUNT=7, "
                                            "OMP_WAIT_POLICY=ACTIVE); omp_spin_count=10000 not applied")


@pytest.mark.parametrize("key,value", [("OMP_WAIT_POLICY", "PASSIVE"), ("GOMP_SPINCOUNT", "7")])
def test_the_environment_wins(bare_env: pytest.MonkeyPatch, key: str, value: str) -> None:
    bare_env.setenv(key, value)
    line = configure_openmp_wait(10000)
    assert {k: os.environ.get(k) for k in ENV_KEYS} == {k: (value if k == key else None) for k in ENV_KEYS}
    assert f"{key}={value}" in line and "not applied" in line


@pytest.mark.parametrize("value", [-1, "lots", None, True, 1.5])
def test_a_bad_value_is_left_to_pre_flight(bare_env: pytest.MonkeyPatch, value: object) -> None:
    assert "not applied (pre-flight checks it)" in configure_openmp_wait(value)
    assert not any(k in os.environ for k in ENV_KEYS)


def test_too_late_once_torch_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    _unset_restoring(monkeypatch)
    monkeypatch.setattr(openmp, "_APPLIED", {})
    assert configure_openmp_wait(10000) == ("torch was loaded before the run started, so omp_spin_count=10000 does "
                                            "not apply (libgomp read its settings when torch loaded: its defaults)")
    assert not any(k in os.environ for k in ENV_KEYS)


def test_too_late_names_both_variables_torch_loaded_with(monkeypatch: pytest.MonkeyPatch) -> None:
    _unset_restoring(monkeypatch)
    applied = {"GOMP_SPINCOUNT": "5", "OMP_WAIT_POLICY": "ACTIVE"}
    monkeypatch.setattr(openmp, "_APPLIED", dict(applied))  # as if ours, so not "the environment's"
    for key, value in applied.items():
        monkeypatch.setenv(key, value)
    assert configure_openmp_wait(0).endswith("(libgomp read its settings when torch loaded: GOMP_SPINCOUNT=5, "
                                             "OMP_WAIT_POLICY=ACTIVE)")


def test_later_jobs_of_a_sweep_keep_the_first_jobs_setting(bare_env: pytest.MonkeyPatch) -> None:
    """A sweep's jobs run one after another in one process: the first sets the variable before
    torch loads; a later job asking for the same is told it holds (it is ours, not the user's
    environment), one asking for another is told it comes too late."""
    assert "spin 300 iterations" in configure_openmp_wait(300)
    bare_env.setitem(sys.modules, "torch", torch)
    assert configure_openmp_wait(300) == configure_openmp_wait(300)
    assert "spin 300 iterations" in configure_openmp_wait(300)
    assert configure_openmp_wait(0).endswith("does not apply (libgomp read its settings when torch loaded: "
                                             "GOMP_SPINCOUNT=300)")
    assert os.environ["GOMP_SPINCOUNT"] == "300" and "OMP_WAIT_POLICY" not in os.environ


def test_a_new_setting_replaces_its_own_earlier_one(bare_env: pytest.MonkeyPatch) -> None:
    configure_openmp_wait(300)
    configure_openmp_wait(0)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ


def test_an_earlier_setting_someone_removed_is_no_error(bare_env: pytest.MonkeyPatch) -> None:
    configure_openmp_wait(300)
    del os.environ["GOMP_SPINCOUNT"]
    configure_openmp_wait(0)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def test_run_py_sets_the_wait_before_torch_loads(tmp_path: Path) -> None:
    """The CLI: with neither variable in the environment, the run sets the configured spin count
    while torch is not loaded yet (the function says so only then), and logs it."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    cmd = [sys.executable, "run.py", "engine=scripted", "logger=jsonl", "num_rollout=1", "omp_spin_count=4321",
           f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (tmp_path / "run" / "run.log").read_text()
    assert "OpenMP threads spin 4321 iterations before they sleep" in log


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_a_thread_gives_its_openmp_workers_back() -> None:
    """A thread that ran a parallel op holds a worker thread afterwards; release_thread_workers
    ends it (the thread count drops by the pool's workers), and the next op starts new ones."""
    released: list[bool] = []
    x = torch.randn(512, 512)
    counts = _counts_in_a_thread(("after op", lambda: (x @ x).sum()),
                                 ("after release", lambda: released.append(release_thread_workers())),
                                 ("after next op", lambda: (x @ x).sum()))
    assert released == [True]
    assert counts["after release"] == counts["after op"] - 1  # its one worker (2 threads) ended
    assert counts["after next op"] == counts["after op"]


def _counts_in_a_thread(*steps: tuple[str, Callable[[], object]]) -> dict[str, int]:
    """Run the (label, fn) steps in a new thread with 2 torch threads; the process's thread count
    after each step, by label."""
    counts: dict[str, int] = {}
    threads_before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        def work() -> None:
            for label, fn in steps:
                fn()
                counts[label] = _threads()
            release_thread_workers()

        t = threading.Thread(target=work)
        t.start()
        t.join()
    finally:
        torch.set_num_threads(threads_before)
    return counts


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_a_thread_waiting_for_the_rollout_loop_gives_its_workers_back() -> None:
    """run_sync (how the main thread runs a rollout after training): the caller only waits, so its
    OpenMP workers end and the engine's decode thread spins alone (pipeline/process/openmp.py)."""
    from pipeline.rollout.async_loop import get_loop, run_sync

    get_loop()  # the loop's own thread exists before counting

    async def nothing() -> None:
        return None

    x = torch.randn(512, 512)
    counts = _counts_in_a_thread(("after op", lambda: (x @ x).sum()), ("after", lambda: run_sync(nothing())))
    assert counts["after"] == counts["after op"] - 1


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_the_async_trainer_thread_gives_its_workers_back_after_each_job() -> None:
    from types import SimpleNamespace

    from pipeline.loop.runner_async import _train

    x = torch.randn(512, 512)

    class MatmulTrainer:
        def train(self, rollout_id: int, train_data: object) -> dict[str, float]:
            return {"train/loss": float((x @ x).sum())}

    ctx = SimpleNamespace(rollout_id=0, train_data={"tokens": []})
    counts = _counts_in_a_thread(("after op", lambda: None), ("after", lambda: _train(MatmulTrainer(), ctx)))
    assert counts["after"] == counts["after op"]  # the job's workers came and went
    counts = _counts_in_a_thread(("after op", lambda: (x @ x).sum()),
                                 ("after", lambda: _train(MatmulTrainer(), ctx)))
    assert counts["after"] == counts["after op"] - 1
