"""One background asyncio loop shared by the rollout, eval and the engines they drive.

Rollout functions are synchronous (`fn(args, rollout_id, data_source, evaluation=False)`), but
engines are async and some keep loop-bound state (HTTP clients, queues, futures). Running every
coroutine on one long-lived loop in a daemon thread keeps that state valid across rollouts and
works whether or not the caller is itself inside a running loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from pipeline.process.openmp import release_thread_workers

__all__ = ["run_sync", "get_loop"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _forget_loop_after_fork() -> None:
    """In a forked child the loop's thread does not exist (fork copies only the calling thread):
    drop the loop, so the next call starts one there instead of waiting on a dead one forever."""
    global _lock, _loop
    _lock = threading.Lock()
    _loop = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_loop_after_fork)


def get_loop() -> asyncio.AbstractEventLoop:
    """The shared loop, started on first use in a daemon thread."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="rollout-loop", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the shared loop and block until it finishes; exceptions propagate.

    When called from the loop's own thread (a coroutine calling a sync rollout function) this
    would deadlock, so it raises instead.
    """
    loop = get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("run_sync called from the rollout loop itself; await the coroutine instead")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    # the caller only waits now: the OpenMP workers its torch work left (a trainer's, a weight
    # sync's) would cut the engine's spin-wait for as long as the coroutine runs (pipeline.process.openmp)
    release_thread_workers()
    try:
        return future.result()
    except KeyboardInterrupt:
        future.cancel()
        raise
