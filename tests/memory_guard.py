"""A memory guard for the test session: a runaway test fails fast instead of exhausting the machine.

pytest-timeout interrupts a test after its time limit, but a loop that allocates can take the
whole machine's memory long before that (an endless epoch-cursor loop under Hypothesis grew to
18 GB inside a 300 s limit). `MemoryGuard` polls this process's resident memory; above the
limit it raises `MemoryLimitExceeded` in the main thread (so the test fails and the session goes
on); if memory then keeps growing past `hard_factor` times the limit (a loop in C that cannot
be interrupted) it dumps every thread's stack and ends the process.

Before it trips, the guard asks glibc to hand free heap pages back (`malloc_trim(0)`) and
measures again: a long session's freed-but-kept heap is not a runaway (the last real-model test
of a 1,200-test CI session read 7.2 GB, of which the test itself peaks at 4.8 GB alone).

The session guard is started by tests/conftest.py with `ROLLOUT_PIPELINE_TEST_MAX_RSS_MB`
(default 7168; 0 turns it off).
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import sys
import threading

import psutil

__all__ = ["MemoryGuard", "MemoryLimitExceeded", "DEFAULT_MAX_RSS_MB", "trim_free_heap"]

logger = logging.getLogger(__name__)

# 7168: the whole suite in one session peaks near 6.3 GB since the hf engine keeps its decode
# weights in oneDNN's blocked layout (+262 MB per live engine); a runaway grows far past it
DEFAULT_MAX_RSS_MB = 7168


def _malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_LIBC_MALLOC_TRIM = _malloc_trim()


def trim_free_heap() -> None:
    """Hand glibc's free heap pages back to the system (no-op without glibc)."""
    if _LIBC_MALLOC_TRIM is not None:
        _LIBC_MALLOC_TRIM(0)


class MemoryLimitExceeded(BaseException):
    """Raised in the main thread when the process's resident memory passes the guard's limit.

    A BaseException (like pytest's own outcomes), so `except Exception` in the code under test
    and Hypothesis's shrinking do not swallow it and re-run the runaway example.
    """

    def __str__(self) -> str:
        return ("the test session's resident memory passed the limit of the memory guard "
                "(ROLLOUT_PIPELINE_TEST_MAX_RSS_MB, tests/memory_guard.py): a runaway loop or allocation")


class MemoryGuard:
    """Watch this process's RSS from a daemon thread (see module docstring)."""

    def __init__(self, limit_mb: float, interval_s: float = 0.25, hard_factor: float = 1.5) -> None:
        if limit_mb <= 0:
            raise ValueError(f"memory guard limit must be > 0 MB, got {limit_mb}")
        self.limit_bytes = int(limit_mb * 2**20)
        self.interval_s = interval_s
        self.hard_bytes = int(self.limit_bytes * hard_factor)
        self.tripped = 0
        self.peak_bytes = 0
        self._target = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process = psutil.Process(os.getpid())

    def start(self) -> MemoryGuard:
        """Start watching (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="memory-guard", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _rss(self) -> int:
        return self._process.memory_info().rss

    def _rss_after_trim(self) -> int:
        """RSS after glibc returned its free heap pages to the system (RSS as is elsewhere)."""
        trim_free_heap()
        return self._rss()

    def _watch(self) -> None:
        armed = True
        while not self._stop.wait(self.interval_s):
            rss = self._rss()
            self.peak_bytes = max(self.peak_bytes, rss)
            if rss > self.limit_bytes and armed:
                rss = self._rss_after_trim()
            if rss <= self.limit_bytes:
                armed = True
                continue
            if armed:
                armed = False  # once per excursion above the limit
                self.tripped += 1
                logger.error("memory guard: RSS %.0f MB > limit %.0f MB; interrupting the main thread",
                             rss / 2**20, self.limit_bytes / 2**20)
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self._target), ctypes.py_object(MemoryLimitExceeded))
            elif rss > self.hard_bytes:
                sys.stderr.write(f"memory guard: RSS {rss / 2**20:.0f} MB kept growing after the interrupt "
                                 f"(hard limit {self.hard_bytes / 2**20:.0f} MB); stacks follow, then exit\n")
                faulthandler.dump_traceback(all_threads=True)
                os._exit(70)
