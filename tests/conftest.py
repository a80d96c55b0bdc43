"""Shared test set-up: offline wandb, Ray without auth, no hub downloads, passive OpenMP waits
(set before anything imports torch; see run.py)."""

import os
import shutil

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_configure(config) -> None:
    """Start the session's memory guard (tests/memory_guard.py): a test whose process passes
    ROLLOUT_PIPELINE_TEST_MAX_RSS_MB (default 7168, 0: off) fails at once instead of taking the
    machine's memory; the per-test time limit (pytest-timeout) stays the guard against hangs."""
    from memory_guard import DEFAULT_MAX_RSS_MB, MemoryGuard

    limit = float(os.environ.get("ROLLOUT_PIPELINE_TEST_MAX_RSS_MB", DEFAULT_MAX_RSS_MB))
    if limit > 0 and not hasattr(config, "_memory_guard"):
        config._memory_guard = MemoryGuard(limit).start()


def pytest_terminal_summary(terminalreporter, config) -> None:
    """One line with the session's peak resident memory against the guard's limit."""
    guard = getattr(config, "_memory_guard", None)
    if guard is not None:
        terminalreporter.write_line(f"memory guard: peak RSS {guard.peak_bytes / 2**20:.0f} MB of the "
                                    f"{guard.limit_bytes / 2**20:.0f} MB limit (tests/memory_guard.py)")


def pytest_unconfigure(config) -> None:
    guard = getattr(config, "_memory_guard", None)
    if guard is not None:
        guard.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """`ROLLOUT_PIPELINE_TEST_CPU_CAP=S` fails a test once it has used S seconds of CPU time,
    `ROLLOUT_PIPELINE_TEST_IDLE_CAP=S` once it has waited S seconds without running (the mutation
    run sets them: a mutant that makes a test spin or wait forever costs seconds; tests/cpu_guard.py)."""
    from cpu_guard import cpu_time_limit

    with cpu_time_limit(float(os.environ.get("ROLLOUT_PIPELINE_TEST_CPU_CAP", "0") or 0), item.nodeid,
                        float(os.environ.get("ROLLOUT_PIPELINE_TEST_IDLE_CAP", "0") or 0)):
        yield


def pytest_collection_modifyitems(config, items) -> None:
    """`ROLLOUT_PIPELINE_TEST_TIMEOUT_CAP=S` caps every test's time limit at S seconds (the
    mutation run sets it: a mutant that hangs a test costs S, not the test's full limit)."""
    cap = float(os.environ.get("ROLLOUT_PIPELINE_TEST_TIMEOUT_CAP", "0") or 0)
    if cap <= 0:
        return
    # import the heavy libraries now, so a test's first import does not eat its capped time
    # (pyarrow pulls pandas in on a data source's first read: a second of the first test)
    import pandas  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    for item in items:
        marker = item.get_closest_marker("timeout")
        limit = marker.args[0] if marker is not None and marker.args else config.getoption("timeout", None)
        if limit is None or float(limit) <= 0 or float(limit) > cap:
            item.add_marker(pytest.mark.timeout(cap), append=False)


# free disk (GB) the end-to-end tests need under the temp folder: the largest trainer test holds two
# fully fine-tuned SmolLM2 runs (a 1.6 GB trainer state and a 0.5 GB policy each, plus a second
# state while a checkpoint is written); pyproject.toml deletes a passed test's folder at once
SLOW_TESTS_FREE_GB = 8.0


def pytest_collection_finish(session) -> None:
    """Stop before the first test when the selected tests need more free disk than there is
    (`ROLLOUT_PIPELINE_TEST_MIN_FREE_GB`, default SLOW_TESTS_FREE_GB when a `slow` test is
    selected, else 0), instead of failing with "No space left on device" minutes in."""
    slow = any(item.get_closest_marker("slow") is not None for item in session.items)
    need = float(os.environ.get("ROLLOUT_PIPELINE_TEST_MIN_FREE_GB", SLOW_TESTS_FREE_GB if slow else 0) or 0)
    if need <= 0:
        return
    folder = str(session.config._tmp_path_factory.getbasetemp().parent)
    free = shutil.disk_usage(folder).free / 2**30
    if free < need:
        pytest.exit(f"{folder} has {free:.1f} GB free; the selected tests need {need:.0f} GB there (the real-model "
                    f"trainer tests write fully fine-tuned checkpoints). Free some disk, point TMPDIR elsewhere, or "
                    f"set ROLLOUT_PIPELINE_TEST_MIN_FREE_GB to a lower value (0: no check).", returncode=1)
