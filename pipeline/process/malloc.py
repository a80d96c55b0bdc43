"""Whether memory freed by large tensors goes back to the OS: the `keep_freed_memory` key.

torch allocates CPU tensors with the C library's malloc. glibc serves a large block (above 32 MB
always, above 128 KB to 32 MB by its adaptive rule) with a fresh `mmap` and returns it with
`munmap` as soon as it is freed, and gives back the free top of its heap beyond 128 KB. A training
step allocates and frees hundreds of megabytes of such blocks (the output logits, activations,
the embedding gradient, the bfloat16 weight copies of autocast), so every step maps them anew and
the kernel faults in and zeroes each 4 KB page again: measured on the train data of 5 rollouts
sized like bench/trainer.py, 150,000-370,000 page faults and 0.3-1.4 s of kernel time per
training step (2.6-3.6 s), and on the first steps more kernel time than computing.

`keep_freed_memory: true` tells glibc (`mallopt`) to serve large blocks from its heap
(`M_MMAP_MAX` 0) and to keep up to 2 GB of freed memory there (`M_TRIM_THRESHOLD`), so a step
reuses the pages the one before mapped: no page faults once the heap has grown to the step's
peak, and steps of 2.4-2.8 s on the same data (inside an `experiment=learn` run the median step
went from 3.01 to 2.87 s; docs/performance.md, "History"). The price: the process holds on to
memory it freed (its resident size stays near its peak; +0.4 GB on that run).
Threads other than the main one keep their own glibc arenas, whose blocks above 64 MB still
come from `mmap`.

Set for the duration of a run (`pipeline.run.app.run`; glibc applies it to later allocations) and put
back to glibc's default values when the run ends, so an in-process caller (a notebook, the test
suite) gets its process back as it was, except that glibc's adaptive mmap threshold stays where
it was then. It is left alone where the environment sets one of `ENV_KEYS` (glibc read it at
start) and where the C library is not glibc (no `mallopt`). It acts on this process only: Ray
replicas and HTTP servers only generate, and generation faults little (a run without a trainer:
under 1 s of kernel time in 16 s). Nor does it apply when nothing in the run's own process
computes on the CPU (the hf engine on CUDA and no trainer computing here:
`pipeline.cluster.devices.process_cpu_idle`): it switches itself off with one log line.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.cluster.devices import process_tuning_note

__all__ = ["ENV_KEYS", "HUGE_PAGES_TUNABLE", "RELEASE_THRESHOLD", "keep_freed_memory", "keep_freed_memory_problem",
           "release_env", "release_freed_memory"]

# glibc's tunables for the same settings; one of them in the environment wins over the key
ENV_KEYS = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
# the most mallopt takes (an int): free memory at the heap's top kept up to 2 GB
_KEPT_BYTES = 2**31 - 1
# glibc's defaults, put back when the run ends
_DEFAULT_MMAP_MAX = 65536
_DEFAULT_TRIM_THRESHOLD = 128 * 1024


def _preset(environ: Mapping[str, str]) -> list[str]:
    """The `ENV_KEYS` that `environ` sets, as `KEY=value` (the environment wins over our settings)."""
    return [f"{key}={environ[key]}" for key in ENV_KEYS if key in environ]


def keep_freed_memory_problem(value: Any) -> str | None:
    """Pre-flight's message for a `keep_freed_memory` that is not true or false, else None."""
    if isinstance(value, bool):
        return None
    return f"keep_freed_memory: expected true or false, got {value!r}"


@contextlib.contextmanager
def keep_freed_memory(enabled: Any, cpu_idle: str | None = None) -> Iterator[str]:
    """Apply `keep_freed_memory` to this process while the block runs (module docstring) and put
    glibc's default values back after it; yields what took effect, for the log. A value that is
    not a bool is left for pre-flight to refuse. `cpu_idle`: why nothing in this process computes
    on the CPU (`devices.process_cpu_idle`); the key is then off and nothing is set."""
    said, applied = _apply(enabled, cpu_idle)
    try:
        yield said
    finally:  # an in-process caller (a notebook, the tests) gets its process back as it was
        if applied:
            _restore()


def _apply(enabled: Any, cpu_idle: str | None) -> tuple[str, bool]:
    """Set the mallopt values when `enabled` and nothing stands in the way; (what took effect,
    whether they were set)."""
    if keep_freed_memory_problem(enabled) is not None:
        return f"keep_freed_memory={enabled!r} not applied (pre-flight checks it)", False
    if cpu_idle is not None and enabled:
        return process_tuning_note("keep_freed_memory", cpu_idle), False
    if not enabled:
        return "freed memory goes back to the OS as glibc decides (keep_freed_memory=false)", False
    preset = _preset(os.environ)
    if preset:
        return f"malloc as the environment says ({', '.join(preset)}); keep_freed_memory not applied", False
    mallopt = _mallopt()
    if mallopt is None:
        return "keep_freed_memory not applied: the C library has no mallopt (not glibc)", False
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, _KEPT_BYTES)):
        _restore()
        return "keep_freed_memory not applied: mallopt refused it", False
    return "freed memory stays in the process for reuse (keep_freed_memory: no mmap, trim above 2 GB)", True


# release_freed_memory: blocks from this size up are mapped on their own and unmapped when freed
RELEASE_THRESHOLD = 128 * 1024


def release_freed_memory() -> str:
    """The opposite policy, for a process whose point is a small footprint (an FSDP2 trainer
    worker, `trainer.release_freed_memory`): every block of `RELEASE_THRESHOLD` bytes or more gets
    a mapping of its own, unmapped as soon as it is freed, and the heap's free top beyond that is
    trimmed at once. Fixing the threshold (`M_MMAP_THRESHOLD`) turns off glibc's adaptive rule,
    which raises it to 32 MB after the first large free, so that a training step's activations,
    gathered parameters and gradients (mostly 0.1-32 MB each) land in the heap between long-lived
    tensors, where freed memory cannot be returned: on 2 FSDP2 workers of SmolLM2-135M about 1 GB
    of a worker's 3 GB peak was such freed memory (docs/training.md). Applies to later
    allocations of this whole process, for its lifetime; returns what took effect, for the log,
    huge pages included (a process started with `release_env` maps its blocks with them)."""
    preset = _preset(os.environ)
    if preset:
        return f"malloc as the environment says ({', '.join(preset)}); release_freed_memory not applied"
    mallopt = _mallopt()
    if mallopt is None:
        return "release_freed_memory not applied: the C library has no mallopt (not glibc)"
    if not (mallopt(_M_MMAP_THRESHOLD, RELEASE_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, RELEASE_THRESHOLD)):
        return "release_freed_memory not applied: mallopt refused it"
    return (f"freed memory goes back to the OS at once (release_freed_memory: blocks of "
            f"{RELEASE_THRESHOLD // 1024} KB and more mapped on their own; {_huge_pages_note()})")


# glibc (2.35 and later) reads this tunable when a process starts: it advises the kernel to back
# the blocks it maps with transparent huge pages, so a block freshly mapped under
# `release_freed_memory` faults in once per 2 MB instead of once per 4 KB (a 16 MB tensor mapped
# 100 times: 52,000 page faults instead of 410,000, tests/test_malloc.py; FSDP2 workers' steps
# 7-13% faster at the same peak, docs/performance.md)
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
# where Linux says whether it grants transparent huge pages ("always [madvise] never")
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# the environment this process was started with, the one glibc read its tunables from
_START_ENV = Path("/proc/self/environ")


def release_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Environment variables to start a process with that will call `release_freed_memory`: glibc's
    huge-page tunable added to `environ`'s `GLIBC_TUNABLES`. Nothing where `environ` already sets
    a hugetlb tunable or one of `ENV_KEYS` (the environment wins, as in `release_freed_memory`)."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables or _preset(environ):
        return {}
    return {"GLIBC_TUNABLES": f"{tunables}:{HUGE_PAGES_TUNABLE}" if tunables else HUGE_PAGES_TUNABLE}


def _huge_pages_note() -> str:
    """Whether this process maps its blocks with transparent huge pages, for the log line."""
    try:
        started = _START_ENV.read_bytes().split(b"\0")
    except OSError:
        return "huge pages unknown (no /proc/self/environ)"
    tunables = [tunable for entry in started if entry.startswith(b"GLIBC_TUNABLES=")
                for tunable in entry.decode(errors="replace").removeprefix("GLIBC_TUNABLES=").split(":")]
    if HUGE_PAGES_TUNABLE not in tunables:
        return f"4 KB pages: the process started without {HUGE_PAGES_TUNABLE} in GLIBC_TUNABLES"
    try:
        chosen = re.search(r"\[(\w+)\]", _THP_MODE.read_text())
    except OSError:
        chosen = None
    if chosen is None:
        return f"{HUGE_PAGES_TUNABLE}, but the kernel says nothing of transparent huge pages"
    mode = chosen.group(1)
    if mode == "never":
        return f"{HUGE_PAGES_TUNABLE}, but the kernel grants no transparent huge pages ({_THP_MODE}: never)"
    return f"transparent huge pages ({HUGE_PAGES_TUNABLE}, kernel: {mode})"


def _restore() -> None:
    """glibc's default values of the two settings."""
    mallopt = _mallopt()
    mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
    mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)


@functools.cache
def _mallopt() -> Any:
    """glibc's `mallopt` of this process, or None."""
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn
