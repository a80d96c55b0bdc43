"""The shared rollout loop (pipeline/rollout/async_loop.py)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from pipeline.rollout.async_loop import get_loop, run_sync

pytestmark = pytest.mark.timeout(30)


async def _answer() -> int:
    await asyncio.sleep(0)
    return 42


def test_run_sync_runs_on_one_shared_loop_and_refuses_its_own_thread():
    assert run_sync(_answer()) == 42 and get_loop() is get_loop()

    async def nested() -> None:
        coro = _answer()
        with pytest.raises(RuntimeError, match="run_sync called from the rollout loop itself"):
            run_sync(coro)

    run_sync(nested())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_run_sync_works_in_a_forked_child():
    """A process forked after the loop started (a worker pool, a test runner) has no loop
    thread: run_sync there starts a new loop instead of waiting forever on the parent's."""
    assert run_sync(_answer()) == 42  # the parent's loop thread is running
    parent_loop = get_loop()
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        code = 3
        try:
            signal.alarm(10)  # a hang ends the child, not the test run
            code = 0 if run_sync(_answer()) == 42 and get_loop() is not parent_loop else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert run_sync(_answer()) == 42 and get_loop() is parent_loop
