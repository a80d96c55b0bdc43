"""Atomic writes (pipeline/process/atomic.py): the old file or the new one, never half of one, no temp left."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from pipeline.process import atomic
from pipeline.process.atomic import atomic_write_bytes, atomic_write_text

pytestmark = pytest.mark.timeout(20)


def test_writes_creates_folders_and_replaces(tmp_path):
    target = tmp_path / "a" / "b" / "state.bin"
    atomic_write_bytes(target, b"one")
    assert target.read_bytes() == b"one"
    atomic_write_bytes(str(target), b"two!")
    assert target.read_bytes() == b"two!"
    atomic_write_text(target, "grüße ✓")
    assert target.read_bytes() == "grüße ✓".encode("utf-8")
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.bin"]


def test_data_is_flushed_and_synced_before_the_rename(tmp_path, monkeypatch):
    target = tmp_path / "state.bin"
    seen = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        seen.append(("fsync", os.fstat(fd).st_size))
        real_fsync(fd)

    def replace(src, dst):
        seen.append(("replace", os.path.basename(src).startswith(".state.bin."), os.path.dirname(src) == str(tmp_path)))
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    atomic_write_bytes(target, b"x" * 5000)
    assert seen == [("fsync", 5000), ("replace", True, True)]


@pytest.mark.parametrize("fail_at", ["write", "replace"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch, fail_at):
    target = tmp_path / "state.bin"
    target.write_bytes(b"old")
    if fail_at == "replace":
        monkeypatch.setattr(atomic.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
        data, error = b"new", OSError
    else:
        data, error = "not bytes", TypeError
    with pytest.raises(error):
        atomic_write_bytes(target, data)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.bin"]


def test_an_interrupt_also_cleans_up(tmp_path, monkeypatch):
    target = tmp_path / "state.bin"

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(target, b"new")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_a_folder_only_when_complete(tmp_path):
    from pipeline.process.atomic import atomic_dir

    target = tmp_path / "state"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("one")
    assert (target / "a.txt").read_text() == "one"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "a.txt").write_text("two")
            raise RuntimeError("killed half-way")
    assert (target / "a.txt").read_text() == "one"  # the old folder is intact
    with atomic_dir(target) as tmp:
        (tmp / "b.txt").write_text("three")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["state"]  # no temp folder left behind


def test_stale_temp_dirs_of_a_killed_writer_are_removed(tmp_path):
    """What atomic_dir leaves when its process is killed before the rename (`.<name>.<random>`)
    goes; the targets themselves, other names and plain files stay."""
    import tempfile

    (tmp_path / "rollout_1").mkdir()
    stale = [Path(tempfile.mkdtemp(dir=tmp_path, prefix=f".{name}.")) for name in ("rollout_2", "rollout_3")]
    (stale[0] / "policy.safetensors").write_bytes(b"half")
    other = Path(tempfile.mkdtemp(dir=tmp_path, prefix=".policy."))
    (tmp_path / ".rollout_4.file").write_text("not a folder")
    removed = atomic.remove_stale_temp_dirs(tmp_path, "rollout_*")
    assert sorted(removed) == sorted(stale) and not any(p.exists() for p in stale)
    assert (tmp_path / "rollout_1").is_dir() and other.is_dir() and (tmp_path / ".rollout_4.file").is_file()
    assert atomic.remove_stale_temp_dirs(tmp_path / "missing", "x") == []


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_files_get_the_mode_a_plain_open_gives(tmp_path, umask_022):
    atomic_write_bytes(tmp_path / "a.bin", b"x")
    with open(tmp_path / "plain.bin", "wb") as fh:
        fh.write(b"x")
    assert (tmp_path / "a.bin").stat().st_mode & 0o777 == 0o644 == (tmp_path / "plain.bin").stat().st_mode & 0o777
    assert atomic.file_mode() == 0o644 and atomic.file_mode(0o777) == 0o755


def test_the_umask_is_read_without_being_changed(umask_022, monkeypatch):
    def no_umask(mask):
        raise AssertionError("the umask was set")

    monkeypatch.setattr(atomic.os, "umask", no_umask)
    assert atomic._umask() == 0o022


def test_without_proc_the_umask_is_set_and_put_back(umask_022, monkeypatch):
    def no_proc(*a, **kw):
        raise OSError("no /proc")

    monkeypatch.setattr(atomic, "open", no_proc, raising=False)
    assert atomic._umask() == 0o022
    monkeypatch.undo()
    assert os.umask(0o022) == 0o022  # put back as it was


def test_make_temp_names_and_cleanup(tmp_path, monkeypatch):
    fd, tmp = atomic.make_temp(tmp_path)
    os.close(fd)
    assert len(os.path.basename(tmp)) == 8  # mkstemp's random part only: no prefix or suffix of its own
    fd, tmp = atomic.make_temp(tmp_path, prefix=".a.", suffix=".part")
    os.close(fd)
    assert os.path.basename(tmp).startswith(".a.") and tmp.endswith(".part")

    def refuse(fd, mode):
        raise PermissionError("fchmod refused")

    monkeypatch.setattr(atomic.os, "fchmod", refuse)
    before = set(os.listdir(tmp_path))
    with pytest.raises(PermissionError, match="fchmod refused"):
        atomic.make_temp(tmp_path)
    assert set(os.listdir(tmp_path)) == before  # the temp file is gone again


def test_a_stale_temp_dir_that_cannot_be_removed_is_no_error(tmp_path, monkeypatch):
    """The clean-up of a killed writer's leftovers never fails the resume that runs it."""
    stale = Path(tempfile.mkdtemp(dir=tmp_path, prefix=".rollout_2."))
    (stale / "policy.safetensors").write_bytes(b"half")
    real_unlink = os.unlink

    def refuse(path, *a, **kw):
        if str(path).endswith("policy.safetensors"):
            raise PermissionError(f"cannot remove {path}")
        return real_unlink(path, *a, **kw)

    monkeypatch.setattr(os, "unlink", refuse)
    assert atomic.remove_stale_temp_dirs(tmp_path, "rollout_*") == [stale]


def test_prune_keeps_the_highest_numbers_not_the_newest_names(tmp_path):
    """Numbers compare as numbers (v10 is newer than v9), other names and files stay, and keep <= 0
    removes nothing."""
    import re

    for name in ("v2", "v9", "v10", "v11", "vx", "latest"):
        (tmp_path / name).mkdir()
    (tmp_path / "v1").write_text("a file, not a folder")
    pattern = re.compile(r"v(\d+)")
    assert atomic.prune_numbered_dirs(tmp_path, pattern, 0) == []
    removed = atomic.prune_numbered_dirs(tmp_path, pattern, 2)
    assert sorted(p.name for p in removed) == ["v2", "v9"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "v1", "v10", "v11", "vx"]
    assert atomic.prune_numbered_dirs(tmp_path / "missing", pattern, 1) == []
    negative = re.compile(r"rollout_(-?\d+)")
    for name in ("rollout_-1", "rollout_0", "rollout_3"):
        (tmp_path / name).mkdir()
    assert [p.name for p in atomic.prune_numbered_dirs(tmp_path, negative, 1)] == ["rollout_-1", "rollout_0"]


def test_a_folder_prune_cannot_remove_is_no_error(tmp_path, monkeypatch):
    """Pruning old weight or state folders never fails the save that runs it."""
    import re

    for name in ("v1", "v2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"weights")
    real_unlink = os.unlink

    def refuse(path, *a, **kw):  # rmtree unlinks by name relative to a dir fd
        if str(path).endswith("model.safetensors"):
            raise PermissionError(f"cannot remove {path}")
        return real_unlink(path, *a, **kw)

    monkeypatch.setattr(os, "unlink", refuse)
    assert [p.name for p in atomic.prune_numbered_dirs(tmp_path, re.compile(r"v(\d+)"), 1)] == ["v1"]
    assert (tmp_path / "v1" / "model.safetensors").is_file()  # the removal really failed
    assert (tmp_path / "v2" / "model.safetensors").is_file()
