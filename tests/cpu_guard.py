"""A per-test CPU-time limit for the mutation run (`ROLLOUT_PIPELINE_TEST_CPU_CAP`, see
tests/conftest.py): a test that spins fails after S seconds of CPU time, however busy the
machine is. A wall-clock limit also counts the time other jobs hold the CPU, so on a busy
machine it fails slow tests that are no hang."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CpuTimeExceeded(BaseException):
    """Raised in the main thread once the process has used the limit's CPU seconds (a
    BaseException, as MemoryLimitExceeded: `except Exception` in the code under test does not
    swallow it)."""


@contextmanager
def cpu_time_limit(seconds: float, what: str) -> Iterator[None]:
    """Raise `CpuTimeExceeded` in the main thread after `seconds` of this process's CPU time
    (all threads), and again every CPU second after that, in case the first one lands where an
    event loop keeps it (an asyncio task stores it until awaited). No-op off the main thread."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def over(signum: int, frame: object) -> None:
        raise CpuTimeExceeded(f"{what}: more than {seconds:g} s of CPU time (ROLLOUT_PIPELINE_TEST_CPU_CAP)")

    previous = signal.signal(signal.SIGPROF, over)
    signal.setitimer(signal.ITIMER_PROF, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
