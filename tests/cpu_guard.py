"""Per-test hang limits for the mutation run (set by scripts/mutation.py through
`ROLLOUT_PIPELINE_TEST_CPU_CAP` / `ROLLOUT_PIPELINE_TEST_IDLE_CAP`, applied in tests/conftest.py).

A mutant that breaks a loop makes a test either spin (it keeps using CPU) or wait forever (an
event loop with nothing left to run). Both limits count only what the test itself does, so a busy
machine does not turn a slow test into a "hang": a wall-clock limit also counts the time other
jobs hold the CPU, and on a shared 2-core machine it failed slow tests that were no hang.

- CPU cap: fails the test after S seconds of the process's CPU time (all threads).
- Idle cap: fails the test after the main thread has spent S seconds neither running nor
  waiting for a CPU (Linux /proc/<pid>/task/<tid>/schedstat: time on CPU and time runnable in
  the run queue); that is a test waiting on something that never comes.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class CpuTimeExceeded(BaseException):
    """Raised in the main thread when a test passes a hang limit (a BaseException, as
    MemoryLimitExceeded: `except Exception` in the code under test does not swallow it)."""


def _schedstat(tid: int) -> float | None:
    """Seconds the thread has run plus waited runnable; None where the kernel does not say."""
    try:
        on_cpu, runnable = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return (int(on_cpu) + int(runnable)) / 1e9


class _IdleWatch:
    """A daemon thread that signals the main thread once it has been idle for `limit` seconds."""

    def __init__(self, limit: float, interval: float = 0.1) -> None:
        self.limit, self.interval = limit, interval
        self.tid = threading.main_thread().native_id
        self.ident = threading.main_thread().ident
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="idle-cap", daemon=True)

    def _watch(self) -> None:
        busy0, wall0 = _schedstat(self.tid), time.monotonic()
        if busy0 is None:
            return
        while not self.stop.wait(self.interval):
            busy = _schedstat(self.tid)
            if busy is None:
                return
            idle = (time.monotonic() - wall0) - (busy - busy0)
            if idle > self.limit:
                signal.pthread_kill(self.ident, signal.SIGUSR2)
                busy0, wall0 = busy, time.monotonic() - self.limit + 1.0  # again in a second if still idle


@contextmanager
def cpu_time_limit(seconds: float, what: str, idle_seconds: float = 0.0) -> Iterator[None]:
    """Raise `CpuTimeExceeded` in the main thread after `seconds` of this process's CPU time, or
    after `idle_seconds` of the main thread waiting without running (0: no such limit), and
    again every second after that, in case the first one lands where an event loop keeps it (an
    asyncio task stores it until awaited). No-op off the main thread."""
    if (seconds <= 0 and idle_seconds <= 0) or threading.current_thread() is not threading.main_thread():
        yield
        return

    def over_cpu(signum: int, frame: object) -> None:
        raise CpuTimeExceeded(f"{what}: more than {seconds:g} s of CPU time (ROLLOUT_PIPELINE_TEST_CPU_CAP)")

    def over_idle(signum: int, frame: object) -> None:
        raise CpuTimeExceeded(f"{what}: waited more than {idle_seconds:g} s without running "
                              f"(ROLLOUT_PIPELINE_TEST_IDLE_CAP)")

    previous = signal.signal(signal.SIGPROF, over_cpu), signal.signal(signal.SIGUSR2, over_idle)
    if seconds > 0:
        signal.setitimer(signal.ITIMER_PROF, seconds, 1.0)
    watch = _IdleWatch(idle_seconds) if idle_seconds > 0 else None
    if watch is not None:
        watch.thread.start()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        if watch is not None:
            watch.stop.set()
            watch.thread.join(timeout=5)
        signal.signal(signal.SIGPROF, previous[0])
        signal.signal(signal.SIGUSR2, previous[1])
