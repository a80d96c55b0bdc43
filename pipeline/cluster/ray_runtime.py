"""The one Ray runtime a run shares between its parts (the `ray` engine's replicas, the trainer's
workers): started or joined by the first part that needs it, shut down when the last one that
started it lets go.

`acquire(address, num_cpus, temp_dir, who)` joins the cluster at `address` ("auto",
"ray://host:port", "host:port"), or starts a local Ray with `num_cpus` CPUs (None: all) and
`num_gpus` GPUs (None: Ray's own count) in a fresh temp dir when `address` is None; a runtime
already up in this process is shared whatever the arguments, except that asking for another
address than the one it joined is refused (two clusters in one run cannot be). `release(lease)`
gives it back: the runtime this module started is shut down with the last lease.
`shuts_down_with(lease)` and `gcs_reachable()` let clean-up skip the calls that would wait a
minute on a GCS that is gone (or about to go).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["RayLease", "acquire", "gcs_reachable", "release", "shuts_down_with"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_holders: list["RayLease"] = []
# what this module did: (address joined or None for a local start, whether it started Ray)
_state: dict[str, Any] = {"address": None, "started": False}


@dataclass(eq=False)
class RayLease:
    """One part's hold on the shared runtime."""

    who: str
    released: bool = False


def acquire(address: str | None, num_cpus: int | None = None, temp_dir: str | None = None, *, who: str,
            num_gpus: int | None = None) -> RayLease:
    """Join or start Ray for `who` (e.g. "engine=ray", "trainer workers"); see the module docstring."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with _lock:
        if ray.is_initialized():
            joined = _state["address"]
            if address and _state["started"]:
                raise ValueError(f"{who}: asks for the Ray cluster at {address!r}, but this run started a local Ray "
                                 f"already for {', '.join(h.who for h in _holders) or 'another part'}; give every "
                                 f"part the same address (engine.address / trainer.address)")
            if address and joined and address != joined:
                raise ValueError(f"{who}: asks for the Ray cluster at {address!r}, but this run joined {joined!r}; "
                                 f"give every part the same address (engine.address / trainer.address)")
        elif address:
            with _sigterm_kept():
                ray.init(address=address, logging_level=logging.WARNING)
            _state.update(address=address, started=False)
            logger.info("%s: joined the Ray cluster at %s", who, address)
        else:
            temp = temp_dir or tempfile.mkdtemp(prefix="ray_")
            options: dict[str, Any] = {"num_cpus": num_cpus, "include_dashboard": False, "_temp_dir": temp,
                                       "logging_level": logging.WARNING, "log_to_driver": False}
            if num_gpus is not None:
                options["num_gpus"] = num_gpus
            with _sigterm_kept():
                ray.init(**options)
            _state.update(address=None, started=True)
        lease = RayLease(who)
        _holders.append(lease)
        return lease


@contextlib.contextmanager
def _sigterm_kept() -> Iterator[None]:
    """`ray.init` replaces the process's SIGTERM handler (with one that kills the node's processes
    and exits with code 1): the handler from before comes back, so a run stopped by SIGTERM still
    stops as after a Ctrl-C (`pipeline.process.stop_signals`); Ray's atexit hook still shuts its
    processes down."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        yield
    finally:
        if main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)


def shuts_down_with(lease: RayLease | None) -> bool:
    """Whether releasing `lease` shuts the runtime down: this module started it (a local Ray) and
    `lease` is its last holder. Its placement groups and actors then go with it, so removing them
    one by one first is no use; after a stop signal to the whole process group it would wait 60 s
    on a GCS that is exiting."""
    with _lock:
        return bool(_state["started"]) and lease is not None and _holders == [lease]


def gcs_reachable(timeout_s: float = 1.0) -> bool:
    """Whether the GCS of the Ray cluster this process is connected to accepts a connection.

    False once the GCS has gone: a signal to the whole process group (`timeout` without
    `--foreground`, SLURM's `scancel`) stops a local Ray's own processes with the run, or the head
    of a joined cluster went down. Ray's calls that need the GCS (`remove_placement_group`) then
    retry for 60 s before Ray ends the process with exit code 1, so clean-up skips them. True where
    the address cannot be told (Ray Client): clean-up then goes on as before."""
    import ray

    if not ray.is_initialized():
        return False
    try:
        host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
        port_number = int(port)
    except Exception:  # noqa: BLE001 - Ray Client or an older Ray: no address to try
        return True
    try:
        socket.create_connection((host, port_number), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def release(lease: RayLease | None) -> None:
    """Give `lease` back; the last holder of a runtime this module started shuts it down."""
    if lease is None or lease.released:
        return
    import ray

    with _lock:
        lease.released = True
        if lease in _holders:
            _holders.remove(lease)
        if not _holders and ray.is_initialized() and (_state["started"] or _state["address"]):
            ray.shutdown()
            _state.update(address=None, started=False)
