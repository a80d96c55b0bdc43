"""trainer.num_threads resolved (pipeline.process.threads): an integer as it is; auto is this
process's CPUs in one process, each worker's Ray reservation over N workers."""

import logging
import os

import pytest

from pipeline.process import threads
from pipeline.process.threads import planned_threads, process_cpus, torch_threads, torch_threads_problem


def test_process_cpus_is_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5} if pid == 0 else set(), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert process_cpus() == 3


def test_process_cpus_without_an_affinity_mask_is_the_machines(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert process_cpus() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert process_cpus() == 1


def test_the_real_mask_is_a_positive_count_no_larger_than_the_machine():
    assert 1 <= process_cpus() <= (os.cpu_count() or 1)


@pytest.mark.parametrize(("workers", "reserved", "expected"), [(2, 1, 1), (2, 0.5, 1), (2, 0.99, 1), (3, 2.9, 2),
                                                               (4, 8, 8), (2, 1.0, 1)])
def test_auto_over_workers_is_the_reservation_rounded_down_at_least_one(workers, reserved, expected):
    assert planned_threads("auto", workers, reserved) == expected


def test_auto_in_one_process_is_its_cpus_whatever_the_reservation(monkeypatch):
    monkeypatch.setattr(threads, "process_cpus", lambda: 7)
    assert planned_threads("auto", 1, 1) == 7
    assert planned_threads("auto", 1, 32) == 7


@pytest.mark.parametrize("workers", [1, 2, 8])
def test_an_integer_is_taken_as_it_is(monkeypatch, workers):
    monkeypatch.setattr(threads, "process_cpus", lambda: 7)
    assert planned_threads(3, workers, 8) == 3
    assert type(planned_threads(3, workers, 8)) is int


def test_auto_says_once_what_it_became_and_why(monkeypatch, caplog):
    monkeypatch.setattr(threads, "process_cpus", lambda: 5)
    with caplog.at_level(logging.INFO, logger="pipeline.process.threads"):
        assert torch_threads("auto", 1, 1) == 5
        assert torch_threads("auto", 2, 1.5) == 1
        assert torch_threads(4, 1, 1) == 4
        assert torch_threads(4, 2, 1) == 4
    assert caplog.messages == [
        "trainer.num_threads: auto -> 5 (the CPUs this process may run on)",
        "trainer.num_threads: auto -> 1 (per worker: trainer.num_cpus_per_worker=1.5, the CPUs Ray reserves for each)"]
    assert [r.levelno for r in caplog.records] == [logging.INFO] * 2


@pytest.mark.parametrize("good", ["auto", 1, 2, 64])
def test_good_values_have_no_problem(good):
    assert torch_threads_problem(good) is None


@pytest.mark.parametrize("bad", [0, -1, 2.5, 1.0, True, False, "2", "AUTO", None, [2]])
def test_bad_values_are_named_with_what_is_expected(bad):
    assert torch_threads_problem(bad) == (
        f"trainer.num_threads={bad!r}: expected an integer >= 1 or auto (this process's CPUs in one process; "
        f"each worker's trainer.num_cpus_per_worker over N workers)")
