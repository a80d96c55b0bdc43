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


def pytest_sessionfinish(session) -> None:
    """In a pytest-xdist worker: hand the guard's peak to the controller (`workeroutput`)."""
    guard = getattr(session.config, "_memory_guard", None)
    if guard is not None and hasattr(session.config, "workeroutput"):
        session.config.workeroutput["peak_rss_bytes"] = guard.peak_bytes


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist controller: keep each finished worker's peak resident memory."""
    peak = getattr(node, "workeroutput", {}).get("peak_rss_bytes")
    if peak is not None:
        node.config._worker_peaks = {**getattr(node.config, "_worker_peaks", {}), node.gateway.id: peak}


def pytest_terminal_summary(terminalreporter, config) -> None:
    """One line with the session's peak resident memory (per worker under pytest-xdist) against
    the guard's limit."""
    guard = getattr(config, "_memory_guard", None)
    if guard is None:
        return
    limit = f"of the {guard.limit_bytes / 2**20:.0f} MB limit (tests/memory_guard.py)"
    peaks = getattr(config, "_worker_peaks", None)
    if peaks:
        each = ", ".join(f"{name} {peak / 2**20:.0f} MB" for name, peak in sorted(peaks.items()))
        terminalreporter.write_line(f"memory guard: peak RSS per worker {each} {limit}")
    else:
        terminalreporter.write_line(f"memory guard: peak RSS {guard.peak_bytes / 2**20:.0f} MB {limit}")


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
    """Inside a pytest-xdist worker (`make test`: `--dist loadfile --no-loadscope-reorder`, a
    worker takes whole files in collection order), the files holding `slow` tests first: the
    long ones first leave short ones to even out the end; a file's own order stays.
    `ROLLOUT_PIPELINE_TEST_TIMEOUT_CAP=S` caps every test's time limit at S seconds (the mutation
    run sets it: a mutant that hangs a test costs S, not the test's full limit)."""
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
        items.sort(key=lambda item: item.path not in slow)
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


def _check_free_disk(config, slow_selected: bool, workers: int = 1) -> None:
    """Stop before the first test when the selected tests need more free disk than there is
    (`ROLLOUT_PIPELINE_TEST_MIN_FREE_GB`, default SLOW_TESTS_FREE_GB per worker when a `slow` test
    is selected, else 0), instead of failing with "No space left on device" minutes in."""
    default = SLOW_TESTS_FREE_GB * workers if slow_selected else 0
    need = float(os.environ.get("ROLLOUT_PIPELINE_TEST_MIN_FREE_GB", default) or 0)
    if need <= 0:
        return
    folder = str(config._tmp_path_factory.getbasetemp().parent)
    free = shutil.disk_usage(folder).free / 2**30
    if free < need:
        pytest.exit(f"{folder} has {free:.1f} GB free; the selected tests need {need:.0f} GB there (the real-model "
                    f"trainer tests write fully fine-tuned checkpoints). Free some disk, point TMPDIR elsewhere, or "
                    f"set ROLLOUT_PIPELINE_TEST_MIN_FREE_GB to a lower value (0: no check).", returncode=1)


def _xdist_workers(config) -> int:
    """pytest-xdist workers this process hands tests to (0: it runs them itself)."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") == "no":
        return 0
    try:
        return int(config.getoption("numprocesses") or 0)
    except (TypeError, ValueError):
        return 2


def pytest_sessionstart(session) -> None:
    """Under pytest-xdist the controller, which collects nothing, checks the disk for every
    worker: a `slow` test counts as selected unless `-m` excludes them."""
    workers = _xdist_workers(session.config)
    if workers:
        slow = "not slow" not in " ".join(str(session.config.getoption("markexpr") or "").split())
        _check_free_disk(session.config, slow, workers)


def pytest_collection_finish(session) -> None:
    """The free-disk check of a session that runs its tests itself (`_check_free_disk`)."""
    if not hasattr(session.config, "workerinput") and not _xdist_workers(session.config):
        slow = any(item.get_closest_marker("slow") is not None for item in session.items)
        _check_free_disk(session.config, slow)
