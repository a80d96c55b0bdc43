"""SIGTERM stops a run as Ctrl-C does.

Schedulers stop a job with SIGTERM and a grace period before SIGKILL (SLURM's `scancel`,
Kubernetes, `docker stop`, `timeout`, a plain `kill`). Python's default for SIGTERM ends the process
on the spot, and Ray's `ray.init` replaces it with a handler that drains and kills the node's
processes and exits with code 1: either way no sink is finished, the run dir keeps its lock file
and nothing says how to go on. While a run runs, SIGTERM instead raises `Terminated` (a
`KeyboardInterrupt`) in the main thread, so every path that handles Ctrl-C handles it too: the
rollout in flight is dropped, a checkpoint being written is finished first, sinks finish, the
lock is released, the resume command is printed, and the run exits with 143 (128 + 15; Ctrl-C:
130).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Terminated", "deferred_stop", "exit_code", "ignore_further_stops", "install_sigterm",
           "sigterm_as_interrupt", "stop_name"]

# the signals that stop a run
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# whether a SIGTERM came since `sigterm_as_interrupt` began: Ray's `ray.get` turns an exception
# that a handler raises while it waits into a plain KeyboardInterrupt, `Terminated` or not
_received = {"sigterm": False}


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the run stops as after a Ctrl-C, with exit code 143."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _received["sigterm"] = True
    raise Terminated


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install_sigterm() -> None:
    """Make SIGTERM raise `Terminated` in the main thread (unless it does already); nothing off the
    main thread (Python allows handlers there only). `ray.init`'s replacement is undone where Ray
    starts (`pipeline.cluster.ray_runtime`)."""
    if _main_thread() and signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` inside the block; the handlers of both stop signals from before
    it come back after (`ignore_further_stops` inside the block holds until then)."""
    if not _main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    _received["sigterm"] = False
    install_sigterm()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def deferred_stop() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back until the block ends, then raise `KeyboardInterrupt` (or
    `Terminated` when a SIGTERM came): what the block writes is written whole (main thread only)."""
    if not _main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda number, frame: caught.append(number))
                for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if signal.SIGTERM in caught:
        _received["sigterm"] = True
        raise Terminated
    if caught:
        raise KeyboardInterrupt


def ignore_further_stops() -> None:
    """Ignore Ctrl-C and SIGTERM from now on (the clean-up after the first is not cut short;
    SIGKILL still ends the process); main thread only."""
    if _main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


def _by_sigterm(exc: BaseException) -> bool:
    return isinstance(exc, Terminated) or _received["sigterm"]


def exit_code(exc: BaseException) -> int:
    """The exit code of a run stopped by `exc`: 143 after SIGTERM (also when something on the way
    re-raised it as a plain KeyboardInterrupt), 130 after Ctrl-C."""
    return 128 + signal.SIGTERM if _by_sigterm(exc) else 128 + signal.SIGINT


def stop_name(exc: BaseException) -> str:
    """How the run was stopped, for its messages: "SIGTERM" or "Ctrl-C"."""
    return "SIGTERM" if _by_sigterm(exc) else "Ctrl-C"
