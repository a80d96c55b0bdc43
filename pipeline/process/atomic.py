"""Atomic file writes: a temp file in the same folder, fsync, then `os.replace`.

A reader sees the old file or the new one, never a half-written one; a writer killed half-way
leaves only a hidden temp file behind. Files get the mode a plain `open()` would give them
(0666 minus the umask), not mkstemp's 0600.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_dir", "atomic_write_bytes", "atomic_write_text", "file_mode", "follow_umask", "make_temp",
           "numbered_dirs", "prune_numbered_dirs", "remove_stale_temp_dirs"]


def _umask() -> int:
    """The process umask, read without changing it (Linux); else by setting it and back."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(base: int = 0o666) -> int:
    """`base` minus the umask: the mode `open()` (base 0666) or `mkdir()` (base 0777) gives."""
    return base & ~_umask()


def follow_umask(path: str | os.PathLike[str]) -> None:
    """Give `path` and everything under it the modes a plain `open()` / `mkdir()` would have
    given (0666 / 0777 minus the umask; a file with an execute bit keeps execute): writers such
    as safetensors' `save_file` and `tempfile.mkdtemp` create 0600 files and 0700 folders, which
    an inference server running as another user cannot read."""
    root = Path(path)
    entries = [root, *root.rglob("*")] if root.is_dir() else [root]
    for entry in entries:
        if entry.is_symlink():
            continue
        if entry.is_dir():
            os.chmod(entry, file_mode(0o777))
        else:
            executable = entry.stat().st_mode & 0o111
            os.chmod(entry, file_mode(0o777 if executable else 0o666))


def make_temp(folder: str | os.PathLike[str], prefix: str = "", suffix: str = "") -> tuple[int, str]:
    """`tempfile.mkstemp` in `folder`, with the mode of a plain `open()` instead of 0600."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=suffix)
    try:
        os.fchmod(fd, file_mode())
    except BaseException:
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
    return fd, tmp


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` via a temp file beside it, fsync and rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = make_temp(path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temp folder beside `path` (mode of a plain `mkdir`); when the block ends
    without an exception it replaces `path` (an existing folder there is removed first), else it
    is deleted. A reader sees the old folder or the complete new one, never a half-written one.
    What the block wrote gets the umask's modes (`follow_umask`), whatever wrote it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        os.chmod(tmp, file_mode(0o777))
        yield tmp
        follow_umask(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale_temp_dirs(parent: str | os.PathLike[str], name_glob: str) -> list[Path]:
    """Delete the temp folders `atomic_dir` left in `parent` for targets named like `name_glob`
    (`.<name>.<random>`) when its writer was killed half-way; returns what was removed. Only for
    folders a single process writes (a run dir under its run.lock): a live writer's temp folder
    would go too."""
    folder = Path(parent)
    if not folder.is_dir():
        return []
    stale = [p for p in folder.glob(f".{name_glob}.*") if p.is_dir()]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def numbered_dirs(parent: str | os.PathLike[str], name: re.Pattern[str]) -> list[tuple[int, Path]]:
    """(number, path) of the folders in `parent` whose names fully match `name` (its first group
    is the number, e.g. `rollout_(-?\\d+)`), lowest number first; [] when `parent` is missing."""
    folder = Path(parent)
    if not folder.is_dir():
        return []
    return sorted((int(m[1]), p) for p in folder.iterdir() if (m := name.fullmatch(p.name)) and p.is_dir())


def prune_numbered_dirs(parent: str | os.PathLike[str], name: re.Pattern[str], keep: int,
                        protect: int | None = None) -> list[Path]:
    """Delete all but the `keep` highest-numbered folders in `parent` whose names fully match
    `name` (`numbered_dirs`), and never the one numbered `protect`; returns what was removed.
    Other entries are left alone; `keep <= 0` removes nothing."""
    if keep <= 0:
        return []
    old = [p for i, p in numbered_dirs(parent, name)[:-keep] if i != protect]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old
