"""SIGKILL in the middle of a save leaves the previous checkpoint loadable (a real subprocess)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pipeline import BufferedDataSource
from pipeline.data import checkpoint as ckpt
from tests.data.conftest import make_rows, write_jsonl

CHILD = textwrap.dedent("""
    import sys, time
    from pipeline import BufferedDataSource
    from pipeline.data import checkpoint as ckpt

    data, save_dir, pause = sys.argv[1], sys.argv[2], float(sys.argv[3])

    def slow_write(f, payload):
        view = memoryview(payload)
        for i, start in enumerate(range(0, len(view), 4096)):
            f.write(view[start:start + 4096])
            f.flush()
            if i == 1:
                print("mid-write", flush=True)
            time.sleep(pause)

    src = BufferedDataSource(prompt_data=data, n_samples_per_prompt=4, seed=1, save_dir=save_dir, keep_checkpoints=2, label_key=None, apply_chat_template=False)
    src.add_samples(src.get_samples(100))
    src.metadata["pad"] = "p" * 50_000  # a checkpoint of many 4 KiB chunks: the kill lands mid-file
    src.save(0)
    print("saved 0", flush=True)
    ckpt._write_bytes = slow_write
    rid = 1
    while True:
        src.add_samples(src.get_samples(1))   # rotate one group through the buffer
        src.metadata["rid"] = rid
        src.save(rid)
        print(f"saved {rid}", flush=True)
        rid += 1
""")


def run_and_kill(tmp_path: Path, data: str, pause: float, kill_on: str, delay: float) -> int:
    """Start the child, SIGKILL it `delay` s after it prints `kill_on`; return the last saved id."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, data, str(tmp_path / "ck"), str(pause)],
                            stdout=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    seen = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.strip())
            if line.strip() == kill_on:
                seen.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        assert seen.wait(timeout=60), f"child never printed {kill_on!r}: {lines}"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    thread.join(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    return max(int(x.split()[1]) for x in lines if x.startswith("saved "))


def check_loadable(tmp_path: Path, data: str, last: int) -> None:
    """The newest valid checkpoint is the last completed save, with its buffer intact."""
    fresh = BufferedDataSource(prompt_data=data, n_samples_per_prompt=4, seed=1, save_dir=tmp_path / "ck", label_key=None, apply_chat_template=False)
    loaded = fresh.load()
    assert loaded in (last, last + 1)  # the rename may have landed just before the kill
    assert fresh.metadata.get("rid", 0) == loaded and fresh.sample_group_index == 100
    assert fresh.get_buffer_length() == 100
    # after k rotations the buffer starts with group k % 100; every group is whole
    assert [g[0].group_index for g in fresh.buffer] == [(loaded + j) % 100 for j in range(100)]
    for g in fresh.buffer:
        gi = g[0].group_index
        assert [(s.group_index, s.index) for s in g] == [(gi, 4 * gi + j) for j in range(4)]


@pytest.mark.timeout(120)
def test_sigkill_mid_save_keeps_previous_checkpoint(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", make_rows(50))
    last = run_and_kill(tmp_path, data, pause=5.0, kill_on="mid-write", delay=0.05)
    assert last == 0
    leftovers = list((tmp_path / "ck").glob(".rollout_1.json.*.tmp"))
    assert leftovers and leftovers[0].stat().st_size >= 8192  # the kill hit a half-written file
    assert not (tmp_path / "ck" / "rollout_1.json").exists()
    check_loadable(tmp_path, data, last)


@pytest.mark.timeout(120)
def test_sigkill_at_random_points(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", make_rows(50))
    rng = random.Random(0)
    for k in range(3):
        run_dir = tmp_path / f"run{k}"
        last = run_and_kill(run_dir, data, pause=0.0005, kill_on="saved 0", delay=rng.uniform(0.05, 0.6))
        check_loadable(run_dir, data, last)
        # keep_checkpoints=2; one more when the kill fell between the rename and the pruning
        assert len(ckpt.list_checkpoints(run_dir / "ck")) <= 3


@pytest.mark.timeout(120)
def test_next_save_removes_a_killed_writers_temp_file(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", make_rows(50))
    run_and_kill(tmp_path, data, pause=5.0, kill_on="mid-write", delay=0.05)
    assert list((tmp_path / "ck").glob(".rollout_*.tmp"))
    src = BufferedDataSource(prompt_data=data, n_samples_per_prompt=4, seed=1, save_dir=tmp_path / "ck", label_key=None, apply_chat_template=False)
    assert src.load() == 0
    src.save(1)
    assert not list((tmp_path / "ck").glob(".rollout_*.tmp"))
