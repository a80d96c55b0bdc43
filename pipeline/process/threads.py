"""How many torch threads the trainer computes with: the `trainer.num_threads` key.

An integer is taken as it is. `auto` (the default) follows where the trainer runs:

- in this process (`trainer.num_workers=1`): the CPUs this process may run on
  (`os.sched_getaffinity`, which a container's or `taskset`'s CPU set narrows; `os.cpu_count()`
  where the platform has no affinity), as torch itself would take;
- over N Ray workers: the CPUs Ray reserves for each (`trainer.num_cpus_per_worker`, rounded
  down, at least 1), Ray's own rule for an actor's `OMP_NUM_THREADS`. The reservation is what
  keeps the workers of one node off each other's cores, so one key sets both: 2 workers on a
  2-core machine get 1 thread each, and `trainer.num_cpus_per_worker=8` gives each worker 8.

The thread count is process-wide in torch, so the trainer sets it again before each round of
training (the hf engine's decode thread sets its own while it generates).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from pipeline.process.precision import AUTO

__all__ = ["planned_threads", "process_cpus", "torch_threads", "torch_threads_problem"]

logger = logging.getLogger(__name__)


def process_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; the machine's CPUs without one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1


def planned_threads(value: Any, num_workers: int, num_cpus_per_worker: float) -> int:
    """`trainer.num_threads` resolved for a trainer of `num_workers` (module docstring), valid
    keys assumed (`torch_threads_problem` found nothing)."""
    if value != AUTO:
        return int(value)
    return process_cpus() if num_workers == 1 else max(int(num_cpus_per_worker), 1)


def torch_threads(value: Any, num_workers: int, num_cpus_per_worker: float) -> int:
    """`planned_threads`, and for `auto` one log line saying what it became and why."""
    threads = planned_threads(value, num_workers, num_cpus_per_worker)
    if value == AUTO:
        why = ("the CPUs this process may run on" if num_workers == 1 else
               f"per worker: trainer.num_cpus_per_worker={num_cpus_per_worker}, the CPUs Ray reserves for each")
        logger.info("trainer.num_threads: auto -> %d (%s)", threads, why)
    return threads


def torch_threads_problem(value: Any) -> str | None:
    """Pre-flight's message for a `trainer.num_threads` that is neither an integer >= 1 nor
    auto, else None."""
    if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return (f"trainer.num_threads={value!r}: expected an integer >= 1 or auto (this process's CPUs in one "
            f"process; each worker's trainer.num_cpus_per_worker over N workers)")
