"""The runaway guards: the session's memory guard turns a runaway allocation into a quick test
failure; the mutation run's CPU-time cap does the same for a test that spins."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import time

import psutil
import pytest

from cpu_guard import CpuTimeExceeded, cpu_time_limit
from memory_guard import MemoryGuard, MemoryLimitExceeded, trim_free_heap

pytestmark = pytest.mark.timeout(60)


def test_runaway_python_loop_is_interrupted_quickly():
    # the guard trims the heap before it trips, so measure from a trimmed heap: late in a long
    # session the trim hands back GBs the session freed, and the loop would have to allocate
    # those again before the guard saw the limit (CI: tripped 1,772 MB in)
    trim_free_heap()
    rss_mb = psutil.Process().memory_info().rss / 2**20
    guard = MemoryGuard(rss_mb + 150, interval_s=0.02).start()
    # fresh anonymous maps, written through: every MB counted is a MB more RSS. (A bytearray
    # can reuse free heap pages a long test session left resident, so RSS lagged the count
    # and the guard tripped 1,106 MB in, in CI.)
    one_mb = b"\x01" * 2**20
    hoard: list[mmap.mmap] = []
    start = time.monotonic()
    try:
        with pytest.raises(MemoryLimitExceeded, match="ROLLOUT_PIPELINE_TEST_MAX_RSS_MB"):
            while True:  # an endless, allocating loop like a cursor that never advances
                block = mmap.mmap(-1, 2**20)
                block.write(one_mb)
                hoard.append(block)
                time.sleep(0.001)
    finally:
        guard.stop()
    grown = len(hoard)
    for block in hoard:
        block.close()
    hoard.clear()
    assert guard.tripped == 1
    assert time.monotonic() - start < 30
    # stopped soon after the limit (MB allocated; a loaded 2-core machine polls late)
    assert 150 <= grown < 1024


def test_memory_limit_exceeded_is_not_an_exception():
    # `except Exception` in the code under test (or Hypothesis shrinking) must not swallow it
    assert not issubclass(MemoryLimitExceeded, Exception)
    with pytest.raises(ValueError, match="> 0 MB"):
        MemoryGuard(0)


def test_session_guard_is_running(pytestconfig):
    if os.environ.get("ROLLOUT_PIPELINE_TEST_MAX_RSS_MB", "").strip() in ("0", "0.0"):
        pytest.skip("the session guard is turned off")
    guard = getattr(pytestconfig, "_memory_guard", None)
    assert guard is not None and guard.limit_bytes > 0


def test_cpu_time_cap_stops_a_spinning_event_loop():
    async def spin() -> None:  # a rollout that never fills its batch: the loop keeps going
        while True:
            # nearly all the time in the coroutine's own body: the cap's signal raised inside
            # the event loop's internals instead can lose the task, and asyncio.run's clean-up
            # would then wait for it forever (seen once in the suite)
            sum(range(200_000))
            await asyncio.sleep(0)

    start = time.process_time()
    with pytest.raises(CpuTimeExceeded, match=r"^spin: more than 0.3 s of CPU time"):
        with cpu_time_limit(0.3, "spin"):
            asyncio.run(spin())
    assert 0.2 <= time.process_time() - start < 5  # (the kernel counts CPU time in ticks)
    assert not issubclass(CpuTimeExceeded, Exception)
    with cpu_time_limit(0.3, "idle"):
        time.sleep(0.5)  # waiting uses no CPU time


def test_idle_cap_stops_an_event_loop_that_waits_forever():
    async def wait_forever() -> None:  # a rollout waiting on a group that never comes back
        await asyncio.Event().wait()

    start = time.monotonic()
    with pytest.raises(CpuTimeExceeded, match=r"^wait: waited more than 0.5 s without running"):
        with cpu_time_limit(0, "wait", idle_seconds=0.5):
            asyncio.run(wait_forever())
    assert time.monotonic() - start < 10
    with cpu_time_limit(0, "busy", idle_seconds=0.5):
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # running is not idling
            pass


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_trim"), reason="needs glibc's malloc_trim")
def test_freed_heap_that_glibc_keeps_is_not_a_runaway():
    # 200 MB of 64 KiB heap blocks, written through, each followed by a small block that stays:
    # the big ones freed leave holes that cannot merge into the heap's top, so RSS stays up until
    # malloc_trim hands their pages back
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    trim_free_heap()
    before_mb = psutil.Process().memory_info().rss / 2**20
    blocks, pins = [], []
    for _ in range(3200):
        blocks.append(libc.malloc(2**16))
        pins.append(libc.malloc(64))
        ctypes.memset(blocks[-1], 1, 2**16)
    for block in blocks:
        libc.free(block)
    try:
        kept_mb = psutil.Process().memory_info().rss / 2**20 - before_mb
        if kept_mb < 150:
            pytest.skip(f"glibc returned the freed heap by itself ({kept_mb:.0f} MB kept)")
        guard = MemoryGuard(before_mb + 100, interval_s=0.02, hard_factor=10).start()
        time.sleep(0.5)
        guard.stop()
        assert guard.tripped == 0
        assert psutil.Process().memory_info().rss / 2**20 < before_mb + 100
    finally:
        for pin in pins:
            libc.free(pin)
