"""Crash-exact resume harness: run the CLI, SIGKILL it at chosen moments, resume, compare.

"Consumed" means: a prompt instance (group_index, its prompt, its sample indices) that reached
the train data of a finished rollout, i.e. is in `samples/rollout_<r>.jsonl` (written together
with `train_data/rollout_<r>.*`) for r = 0 .. num_rollout-1 of the final run dir. A rollout in
flight when the process died is redone from the last checkpoint and its files are overwritten,
so only the final files count. Epoch of a group = group_index // number of prompts (fresh
groups get consecutive group indices as the data order is walked epoch by epoch).

Compared against an uninterrupted run with the same config:
- per rollout: the (prompt, group_index, index) list of the train batch;
- per epoch: the multiset of consumed prompts (lost = in the reference only, duplicated = in
  the resumed run more often than in the reference, plus any group_index consumed twice);
- the buffer of the final checkpoint (group and sample indices, status, response length);
- deterministic mode: the sample dumps, minus timing fields, byte for byte.

Used by `tests/resume/test_resume_kill.py` (2–3 kills) and `scripts/soak_resume.py` (20).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("driver.py")
POINTS = ("generate", "reward", "persist", "checkpoint", "random")
# fields that vary with wall-clock timing; everything else must match byte for byte
TIMING_KEYS = ("rollout_time", "timings", "elapsed", "time")


def write_prompts(path: Path, n: int) -> Path:
    """`n` arithmetic prompts with labels (the scripted engine answers them right part of the time)."""
    rows = [{"input": f"What is {i} + {3 * i + 1}?", "label": str(4 * i + 1)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def overrides(data: Path, num_rollout: int, deterministic: bool, dynamic_filter: str = "nonzero_std",
              token_delay: float = 0.002, over_sampling: str = "fixed") -> list[str]:
    """The CLI overrides of a harness run (scripted engine, buffered source, partial rollout)."""
    return [
        "engine=scripted", f"engine.token_delay={token_delay}", f"engine.token_delay_jitter={token_delay}",
        "data_source=buffered", f"data_source.prompt_data={data}", "data_source.label_key=label",
        f"dynamic_filter={dynamic_filter}", "partial_rollout=true", "save_interval=1",
        "rollout_batch_size=3", "over_sampling_batch_size=5", "n_samples_per_prompt=3",
        "rollout_max_response_len=64", f"num_rollout={num_rollout}", "logger=jsonl",
        f"rollout.over_sampling={over_sampling}", "rollout.progress=false", "rollout.summary=false", f"rollout.deterministic={str(deterministic).lower()}",
    ]


def _env(marks: Path | None, pause: float, pause_at: str | None = None) -> dict[str, str]:
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HYDRA_FULL_ERROR="1",
               OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    for key in ("RESUME_MARKS", "RESUME_PAUSE", "RESUME_PAUSE_AT"):
        env.pop(key, None)
    if marks is not None:
        env["RESUME_MARKS"], env["RESUME_PAUSE"] = str(marks), str(pause)
    if pause_at is not None:
        env["RESUME_PAUSE_AT"] = pause_at
    return env


def _why(err: str) -> str:
    """Warnings plus the tail of a failed run's stderr."""
    warnings = [line for line in err.splitlines() if "WARNING" in line][-10:]
    return "\n".join(warnings + [err[-4000:]])


def run_to_end(args: list[str], timeout: float = 300) -> None:
    """Run the CLI to completion; raise with its output tail when it fails."""
    proc = subprocess.run([sys.executable, str(DRIVER), *args], cwd=ROOT, env=_env(None, 0), capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({proc.returncode}): {' '.join(args)}\n{_why(proc.stderr)}")


def run_and_kill(args: list[str], point: str, nth: int, marks: Path, rng: random.Random,
                 timeout: float = 120) -> bool:
    """Start the CLI, SIGKILL it at the `nth` time it reaches `point`; True when killed, False when
    the run finished first. "random" (pause 0, the run never waits at a mark): soon after the k-th
    mark of any kind, k drawn from 1..20, i.e. at a random moment of the process's first rollout
    (a rollout here reaches 30+ marks, and a resumed process redoes at least one), so it lands
    before the run can finish, however fast the process exits."""
    marks.write_text("")
    pause = 0.0 if point in ("random", "generate") else 0.3
    errfile = marks.with_suffix(".stderr")
    with open(errfile, "w") as err_out:  # a file, not a pipe: a full pipe would block the run
        proc = subprocess.Popen([sys.executable, str(DRIVER), *args], cwd=ROOT, env=_env(marks, pause),
                                stdout=subprocess.DEVNULL, stderr=err_out)
    deadline = time.monotonic() + timeout
    kill_after = rng.randint(1, 20) if point == "random" else None
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"run did not reach {point} #{nth} within {timeout}s")
            if kill_after is not None:
                hit = len(marks.read_text().splitlines()) >= kill_after
            else:
                hit = f"{point} {nth}\n" in marks.read_text()
            if hit:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.01)
        if proc.returncode != 0:
            raise RuntimeError(f"run failed ({proc.returncode}) before the kill:\n{_why(errfile.read_text())}")
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def read_dump(path: Path) -> list[dict[str, Any]]:
    """Sample dicts of a dump, timing fields removed."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [_strip(r) for r in rows]


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in TIMING_KEYS}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def load_source(run_dir: Path, data: Path, n: int, rollout_id: int | None = None) -> Any:
    """Checkpoint `rollout_id` (None: the newest) of `run_dir` loaded into a buffered source
    (tokenizer-free: the fingerprint differs in the tokenizer only, so the data-change check is
    waived)."""
    import logging

    from pipeline.data.sources import BufferedDataSource

    src = BufferedDataSource(prompt_data=str(data), n_samples_per_prompt=n, label_key="label", allow_data_change=True,
                             save_dir=str(run_dir / "checkpoints"), apply_chat_template=False)
    log = logging.getLogger("pipeline.data.persistence")
    level, log.level = log.level, logging.ERROR
    try:
        loaded = src.load(rollout_id)
        if loaded is None or rollout_id not in (None, loaded):
            raise AssertionError(f"{run_dir}: no valid checkpoint {'' if rollout_id is None else rollout_id}")
    finally:
        log.setLevel(level)
    return src


def final_buffer(run_dir: Path, data: Path, n: int) -> list[tuple[Any, ...]]:
    """(group_index, sample indices, statuses, response lengths) of the newest checkpoint's buffer."""
    src = load_source(run_dir, data, n)
    return [(g[0].group_index, tuple(s.index for s in g), tuple(str(s.status) for s in g),
             tuple(s.response_length for s in g)) for g in src.buffer]


@dataclass
class Comparison:
    """What one resumed run looked like next to the reference."""

    groups_compared: int = 0
    lost: int = 0
    duplicated: int = 0
    problems: list[str] = field(default_factory=list)


def compare(ref: Path, got: Path, num_rollout: int, data: Path, num_prompts: int, n: int,
            deterministic: bool) -> Comparison:
    """Compare the resumed run dir `got` against the uninterrupted `ref` (see module docstring)."""
    out = Comparison()
    per_epoch: dict[str, dict[int, Counter[str]]] = {"ref": {}, "got": {}}
    for r in range(num_rollout):
        name = f"samples/rollout_{r}.jsonl"
        a, b = read_dump(ref / name), read_dump(got / name)
        if not (got / f"train_data/rollout_{r}.safetensors").exists():
            out.problems.append(f"rollout {r}: train data missing")
        key_a = [(s["prompt"], s["group_index"], s["index"]) for s in a]
        key_b = [(s["prompt"], s["group_index"], s["index"]) for s in b]
        if key_a != key_b:
            out.problems.append(f"rollout {r}: batch differs: {sorted(set(key_a) ^ set(key_b))[:6]}")
        if deterministic and a != b:
            out.problems.append(f"rollout {r}: sample dumps differ")
        for tag, rows in (("ref", a), ("got", b)):
            for s in rows[::n]:
                per_epoch[tag].setdefault(s["group_index"] // num_prompts, Counter())[json.dumps(s["prompt"])] += 1
        out.groups_compared += len(a) // n
    out.duplicated += sum(c - 1 for c in Counter(_group_runs(got, num_rollout, n)).values() if c > 1)
    for epoch in sorted(set(per_epoch["ref"]) | set(per_epoch["got"])):
        ra, rb = per_epoch["ref"].get(epoch, Counter()), per_epoch["got"].get(epoch, Counter())
        out.lost += sum((ra - rb).values())
        out.duplicated += sum((rb - ra).values())
    steps_a, steps_b = [m["step"] for m in _metrics(ref)], [m["step"] for m in _metrics(got)]
    if steps_a != steps_b:
        out.problems.append(f"metrics.jsonl steps differ: {steps_a} vs {steps_b}")
    elif deterministic:  # the fetch sizes and the carried pass-rate estimate too
        for ma, mb in zip(_metrics(ref), _metrics(got), strict=True):
            for key in ("rollout/groups_submitted", "rollout/pass_rate_ema", "rollout/buffer_size"):
                if ma.get(key) != mb.get(key):
                    out.problems.append(f"step {ma['step']}: {key} {ma.get(key)} vs {mb.get(key)}")
    buf_a, buf_b = final_buffer(ref, data, n), final_buffer(got, data, n)
    if [x[:2] for x in buf_a] != [x[:2] for x in buf_b]:
        out.problems.append(f"final buffer differs: {buf_a[:4]} vs {buf_b[:4]}")
    elif deterministic and buf_a != buf_b:
        out.problems.append("final buffer state (status / partial tokens) differs")
    return out


def accounting(run_dir: Path, num_rollout: int, data: Path, n: int) -> tuple[int, int, int]:
    """Without a dynamic filter every group taken from the data (group_index below the final
    checkpoint's counter) must be consumed exactly once or still be in the buffer.
    Returns (groups accounted, lost, duplicated)."""
    src = load_source(run_dir, data, n)
    places = Counter(_group_runs(run_dir, num_rollout, n)) + Counter(g[0].group_index for g in src.buffer)
    taken = range(src.sample_group_index)
    lost = sum(1 for gi in taken if places[gi] == 0)
    duplicated = sum(c - 1 for c in places.values() if c > 1) + sum(1 for gi in places if gi not in taken)
    return len(taken), lost, duplicated


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _group_runs(run_dir: Path, num_rollout: int, n: int) -> list[int]:
    """group_index of every consumed group across the run (each should appear once)."""
    out = []
    for r in range(num_rollout):
        out.extend(s["group_index"] for s in read_dump(run_dir / f"samples/rollout_{r}.jsonl")[::n])
    return out


def killed_run(work: Path, base: list[str], kills: list[tuple[str, int]],
               rng: random.Random, timeout: float = 120) -> tuple[Path, int, int]:
    """One run dir (CLI overrides `base`) killed at each (point, nth) in turn and resumed after
    each kill (started afresh while it has no checkpoint); finished with a last resume.
    `timeout`: seconds each process may take to reach its kill point (or to finish).
    Returns (run dir, kills done, resumes done)."""
    run_dir = work / "killed"
    marks = work / "marks.txt"
    done_kills = resumes = 0
    for i, (point, nth) in enumerate(kills):
        has_ckpt = any((run_dir / "checkpoints").glob("rollout_*.json")) if run_dir.exists() else False
        extra = [f"resume={run_dir}", f"hydra.run.dir={work / f'rec{i}'}"] if has_ckpt else [f"hydra.run.dir={run_dir}"]
        resumes += has_ckpt
        if run_and_kill(base + extra, point, nth, marks, rng, timeout=timeout):
            done_kills += 1
        else:
            return run_dir, done_kills, resumes  # finished before this kill point
    has_ckpt = any((run_dir / "checkpoints").glob("rollout_*.json"))
    extra = [f"resume={run_dir}", f"hydra.run.dir={work / 'rec_final'}"] if has_ckpt else [f"hydra.run.dir={run_dir}"]
    run_to_end(base + extra, timeout=max(timeout, 300))
    return run_dir, done_kills, resumes + has_ckpt


def plan_kills(rng: random.Random, count: int) -> list[tuple[str, int]]:
    """`count` kill points cycling through every named point, each at a random occurrence."""
    limits = {"generate": 40, "reward": 30, "persist": 2, "checkpoint": 2, "random": 1}
    return [(p, rng.randint(1, limits[p])) for p in (POINTS[i % len(POINTS)] for i in range(count))]
