"""pipeline.process.stop_signals: SIGTERM raises Terminated (a KeyboardInterrupt) while a run runs,
comes back after `ray.init`-like replacements, and is held back with Ctrl-C around a commit."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pipeline.process import stop_signals
from pipeline.process.stop_signals import (Terminated, deferred_stop, exit_code, ignore_further_stops,
                                           install_sigterm, sigterm_as_interrupt, stop_name)


def _wait_for_delivery() -> None:
    """Not passed when the handler raises: Python runs it at once, in this thread."""
    time.sleep(2)
    pytest.fail("SIGTERM was delivered but nothing was raised")


def _quiet_handlers() -> None:
    """Handlers that do nothing: a signal the code under test fails to catch fails the test,
    instead of interrupting pytest (SIGINT) or ending it (SIGTERM)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda number, frame: None)


@pytest.fixture(autouse=True)
def _restore_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_sigterm_raises_terminated_inside_the_block_and_the_old_handler_comes_back():
    def before(signum, frame):
        pass

    signal.signal(signal.SIGTERM, before)
    with pytest.raises(Terminated):
        with sigterm_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            _wait_for_delivery()
    assert signal.getsignal(signal.SIGTERM) is before
    assert issubclass(Terminated, KeyboardInterrupt)  # every Ctrl-C path handles it


def test_install_sigterm_takes_the_signal_back_from_a_replacement():
    with sigterm_as_interrupt():
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as ray.init does with a handler of its own
        install_sigterm()
        assert signal.getsignal(signal.SIGTERM) is stop_signals._on_sigterm
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            _wait_for_delivery()


@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_deferred_stop_finishes_the_block_then_raises(signum, raised):
    _quiet_handlers()
    done = []
    with pytest.raises(raised) as info:
        with sigterm_as_interrupt(), deferred_stop():
            os.kill(os.getpid(), signum)
            done.append("written")  # the block goes on to its end
    assert done == ["written"]
    assert type(info.value) is raised
    assert (exit_code(info.value), stop_name(info.value)) == (
        (143, "SIGTERM") if signum == signal.SIGTERM else (130, "Ctrl-C"))


def test_sigterm_wins_when_both_come_during_a_commit():
    _quiet_handlers()
    with pytest.raises(Terminated):
        with deferred_stop():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)


def test_nothing_raised_without_a_signal_and_further_stops_are_ignored():
    _quiet_handlers()
    with sigterm_as_interrupt(), deferred_stop():
        pass
    ignore_further_stops()
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)  # ignored: the test goes on
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_off_the_main_thread_nothing_is_installed_and_nothing_raises():
    # a run inside a thread (a test, a notebook's worker) keeps the process's handlers as they are
    import threading

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    errors: list[BaseException] = []

    def body() -> None:
        try:
            install_sigterm()
            with sigterm_as_interrupt(), deferred_stop():
                pass
            ignore_further_stops()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert errors == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN


def test_a_sigterm_re_raised_as_a_plain_keyboard_interrupt_still_counts_as_sigterm():
    # ray.get runs the handler while it waits and raises a fresh KeyboardInterrupt instead
    _quiet_handlers()
    with sigterm_as_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            _wait_for_delivery()
        except Terminated:
            plain = KeyboardInterrupt()
        assert (exit_code(plain), stop_name(plain)) == (143, "SIGTERM")
    with sigterm_as_interrupt():  # a new run starts with no SIGTERM seen
        assert (exit_code(KeyboardInterrupt()), stop_name(KeyboardInterrupt())) == (130, "Ctrl-C")
        assert (exit_code(Terminated()), stop_name(Terminated())) == (143, "SIGTERM")  # the exception alone says it
