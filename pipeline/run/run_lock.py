"""One writer per run dir: `<run>/run.lock`, an exclusive `flock` plus who holds it.

The lock file holds `{"pid", "host", "started", "argv"}` (secrets in argv redacted) while a run (or a resume) writes into the
dir, and is emptied when it ends (normally, on an error or on Ctrl-C). The kernel drops the
`flock` of a killed process, so a lock file that still names a holder while nobody holds the
`flock` is stale: it is taken over and the takeover logged. A second writer while the holder is
alive fails at once with `RunDirLocked`, naming the holder's pid and host.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from pipeline.sinks.redact import redact_text

__all__ = ["LOCK_FILE", "RunDirLocked", "acquire", "release"]

logger = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
# run dir (absolute) -> open lock file descriptor, for the locks this process holds
_HELD: dict[str, int] = {}
# run dir -> takeover messages held back until logging is set up (acquired before Hydra started)
_PENDING: dict[str, list[str]] = {}


class RunDirLocked(RuntimeError):
    """Another live process writes into the run dir."""


def _read_holder(fd: int) -> dict[str, object]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    try:
        holder = json.loads(raw) if raw.strip() else {}
    except ValueError:
        holder = {"unreadable": raw[:200].decode("utf-8", "replace")}
    return holder if isinstance(holder, dict) else {}


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire(run_dir: str | os.PathLike[str], defer_log: bool = False) -> None:
    """Lock `run_dir` for this process (when it already holds it: only log what was deferred);
    raises RunDirLocked. `defer_log`: log a stale-lock takeover at the next `acquire` (the run's
    log file does not exist yet)."""
    key = os.path.abspath(run_dir)
    if key in _HELD:
        for message in _PENDING.pop(key, []):
            logger.warning("%s", message)
        return
    path = Path(key) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise RunDirLocked(
            f"run dir {key} is in use by pid {holder.get('pid', '?')} on host {holder.get('host', '?')} "
            f"(since {holder.get('started', '?')}: {holder.get('argv', '?')}); one process writes into a run dir at "
            f"a time: wait for it to end (or stop it), or start a new run elsewhere") from None
    holder = _read_holder(fd)
    host = socket.gethostname()
    if holder:
        if holder.get("host") not in (None, host) and "unreadable" not in holder:
            os.close(fd)  # NFS without flock support: the holder on another host may be alive
            raise RunDirLocked(
                f"run dir {key} is locked by pid {holder.get('pid')} on host {holder.get('host')}, which cannot "
                f"be checked from {host}; if that run is gone, delete {path} and try again")
        message = (f"taking over the stale lock {path} of pid {holder.get('pid')} on host {holder.get('host')} "
                   f"({'still running?' if _pid_alive(holder.get('pid')) else 'no longer running'}; it ended "
                   f"without releasing it)")
        if defer_log:
            _PENDING.setdefault(key, []).append(message)
        else:
            logger.warning("%s", message)
    me = {"pid": os.getpid(), "host": host, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
          "argv": redact_text(" ".join(sys.argv))}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(me).encode())
    os.fsync(fd)
    _HELD[key] = fd


def release(run_dir: str | os.PathLike[str]) -> None:
    """Empty the lock file and drop the lock (a no-op when this process does not hold it)."""
    fd = _HELD.pop(os.path.abspath(run_dir), None)
    if fd is None:
        return
    try:
        os.ftruncate(fd, 0)
    except OSError as exc:  # a dir gone read-only: the flock still goes with the descriptor
        logger.warning("could not empty the lock file of %s: %s", run_dir, exc)
    finally:
        os.close(fd)


@atexit.register
def _release_all() -> None:
    for run_dir in list(_HELD):
        release(run_dir)
