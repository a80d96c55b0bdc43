"""How torch's OpenMP worker threads wait between parallel ops: the `omp_spin_count` key.

torch's CPU build runs its parallel ops (matmuls, attention, large element-wise ops) on GNU
OpenMP (libgomp). When an op ends, its worker threads wait for the next one: they spin (busy-wait)
for `GOMP_SPINCOUNT` iterations, then sleep until woken. Waking a sleeping thread takes tens of
microseconds, more inside a VM, and one decode step of the bundled model runs about 150 parallel
ops, so sleeping at once (`OMP_WAIT_POLICY=PASSIVE`, this project's setting before) made the
2-thread engine's decode steps 1.4-1.9x slower on idle cores; spinning 10,000 iterations (about
half a millisecond) keeps the workers awake across a step and lets them sleep between requests. Next to
another busy process on the same cores the spinning threads take CPU from it and the step was
1.3x slower than with sleeping (docs/performance.md), so the key is a setting: 0 sleeps at once.

Spinning only pays while one thread of the process runs parallel ops: each thread that has run
one keeps its own workers, and once the process holds more OpenMP threads than it has cores,
libgomp cuts every spin to 100 iterations (measured: a second, idle team took a 2-thread decode
step from 41 to 59 ms, the same as sleeping). A thread done with torch work for a while therefore
gives its workers back (`release_thread_workers`): the hf engine's decode thread when it runs out
of requests (a trainer in the main thread then spins alone), a thread that hands requests to the
engine, a thread that waits for the rollout loop (`run_sync`: the main thread after training and
the weight sync; without it, generation after a training step ran 1.5x slower) and the
asynchronous trainer's thread after each job (the decode thread then spins alone).

libgomp reads its settings once, when torch loads it. `configure_openmp_wait` therefore runs
before the pipeline imports torch (`pipeline.run.app.run`, before pre-flight loads the plugins). It
does nothing when the environment already sets `GOMP_SPINCOUNT` or `OMP_WAIT_POLICY` (the
environment wins: the test suite runs PASSIVE), or when torch is already loaded in this process.
Ray replicas get the variable through their runtime env (`pipeline.engines.ray_pool`).

When nothing in the run's own process computes on the CPU (the hf engine on CUDA and no trainer
computing here: `pipeline.cluster.devices.process_cpu_idle`), the key switches itself off: the
environment is left as it is (libgomp's defaults) and one line says why.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Any

from pipeline.cluster.devices import process_tuning_note

__all__ = ["ENV_KEYS", "configure_openmp_wait", "release_thread_workers", "spin_count_problem"]

# the environment variables that decide libgomp's wait (an explicit value wins over the config)
ENV_KEYS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
# what configure_openmp_wait put in the environment (not a user's setting)
_APPLIED: dict[str, str] = {}


def spin_count_problem(spin_count: Any) -> str | None:
    """Pre-flight's message for an `omp_spin_count` that is not an integer >= 0, else None."""
    if isinstance(spin_count, int) and not isinstance(spin_count, bool) and spin_count >= 0:
        return None
    return (f"omp_spin_count: expected an integer >= 0 (0: OpenMP threads sleep as soon as an op ends), "
            f"got {spin_count!r}")


def configure_openmp_wait(spin_count: Any, cpu_idle: str | None = None) -> str:
    """Set how torch's OpenMP threads wait for this process from `omp_spin_count` (0: sleep at
    once, `OMP_WAIT_POLICY=PASSIVE`; n > 0: spin n iterations, `GOMP_SPINCOUNT=n`); returns what
    took effect, for the log. Runs before pre-flight (which imports torch with the plugins), so
    it leaves a value that is not an integer >= 0 alone: pre-flight then refuses it. A sweep's
    jobs run one after another in one process, torch loaded from the second job on: the first
    job's setting holds for all of them (a later job asking for the same is told so; one asking
    for another, that it comes too late). `cpu_idle`: why nothing in this process computes on the
    CPU (`devices.process_cpu_idle`); the key is then off and nothing is set."""
    if spin_count_problem(spin_count) is not None:
        return f"omp_spin_count={spin_count!r} not applied (pre-flight checks it)"
    if cpu_idle is not None:
        return process_tuning_note("omp_spin_count", cpu_idle)
    preset = {key: os.environ[key] for key in ENV_KEYS if key in os.environ and _APPLIED.get(key) != os.environ[key]}
    if preset:
        given = ", ".join(f"{k}={v}" for k, v in preset.items())
        return f"OpenMP threads wait as the environment says ({given}); omp_spin_count={spin_count} not applied"
    wanted = {"OMP_WAIT_POLICY": "PASSIVE"} if spin_count == 0 else {"GOMP_SPINCOUNT": str(spin_count)}
    said = (f"OpenMP threads spin {spin_count} iterations before they sleep (omp_spin_count: GOMP_SPINCOUNT)"
            if spin_count else "OpenMP threads sleep as soon as an op ends (omp_spin_count=0: OMP_WAIT_POLICY=PASSIVE)")
    if "torch" in sys.modules:
        if _APPLIED == wanted:  # an earlier run in this process set it before torch loaded
            return said
        held = ", ".join(f"{k}={os.environ[k]}" for k in ENV_KEYS if k in os.environ) or "its defaults"
        return (f"torch was loaded before the run started, so omp_spin_count={spin_count} does not apply "
                f"(libgomp read its settings when torch loaded: {held})")
    for key in _APPLIED:  # an earlier setting of ours, replaced
        os.environ.pop(key, None)
    os.environ.update(wanted)
    _APPLIED.clear()
    _APPLIED.update(wanted)
    return said


def release_thread_workers() -> bool:
    """Give back the OpenMP worker threads of the calling thread (libgomp's
    `omp_pause_resource_all`: the calling thread's pool only; its next parallel op starts new
    ones). True if released; False where torch runs on another OpenMP runtime (whose pause acts on
    the whole process) or inside a parallel region. Call it once torch is loaded."""
    pause = _libgomp_pause()
    return pause is not None and pause(1) == 0  # 1: omp_pause_soft (libgomp treats both kinds alike)


@functools.cache
def _libgomp_pause() -> Any:
    """libgomp's `omp_pause_resource_all` from the copy this process has loaded (torch's), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "/libgomp" in line})
    except OSError:  # not Linux
        return None
    for path in paths:
        try:
            pause = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):  # an old libgomp without OpenMP 5.0's pause
            continue
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
        return pause
    return None
