"""SIGKILL one of the trainer's 2 torch.distributed workers (trainer.num_workers=2, FSDP2 over gloo,
a tiny random Llama behind the real hf engine) while the driver sends it a rollout: the run
stops at once naming the worker and the resume command, the newest checkpoint stays usable, and
`resume=` continues. Deterministic mode: the resumed run's sample dumps, train data, loss curve
and exported policy equal an uninterrupted 2-worker run's bit for bit; a further resume with
trainer.num_workers=1 (the sharded state resharded into one process) continues it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402
import train_harness  # noqa: E402

NUM_ROLLOUT, NUM_PROMPTS, N = 3, 6, 2


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    return train_harness.tiny_policy(tmp_path_factory.mktemp("tiny_policy"))


def args_for(data: Path, policy: Path) -> list[str]:
    return train_harness.train_overrides(data, policy, NUM_ROLLOUT) + ["trainer.num_workers=2",
                                                                       "trainer.collective_timeout_s=120"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_worker_stops_the_run_and_resume_continues_bit_identically(policy, tmp_path):
    data = harness.write_prompts(tmp_path / "prompts.jsonl", NUM_PROMPTS)
    args = args_for(data, policy)
    ref = tmp_path / "ref"
    harness.run_to_end(args + [f"hydra.run.dir={ref}"])
    got = tmp_path / "killed"
    code, log = train_harness.kill_worker(args, got, tmp_path / "marks.txt", nth=2, rank=1)
    assert log.count("died during") >= 1
    assert code == 1
    assert "trainer worker 1 of 2 died during train" in log
    assert f"python run.py resume={got}" in log
    # rollout 0 is checkpointed with its complete sharded trainer state; nothing newer
    assert sorted(p.name for p in (got / "checkpoints").glob("rollout_*.json")) == ["rollout_0.json"]
    assert (got / "trainer" / "rollout_0" / ".metadata").is_file()
    assert not list((got / "trainer").glob(".rollout_*"))
    harness.run_to_end(args + [f"resume={got}", f"hydra.run.dir={tmp_path / 'rec'}"])

    result = harness.compare(ref, got, NUM_ROLLOUT, data, NUM_PROMPTS, N, deterministic=True)
    assert result.problems == [] and (result.lost, result.duplicated) == (0, 0)
    assert train_harness.train_curve(got) == train_harness.train_curve(ref)  # losses bit for bit
    assert [row["train/weight_version"] for row in train_harness.train_curve(got)] == [1.0, 2.0, 3.0]
    exported = "policy/model.safetensors"
    a, b = load_file(str(ref / exported)), load_file(str(got / exported))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)

    # the finished run continued in one process (num_workers is resume-safe): rollout 2's
    # sharded state of 2 workers loads into it, and its own state is the one-process layout
    harness.run_to_end(args + [f"resume={got}", "num_rollout=4", "trainer.num_workers=1",
                               f"hydra.run.dir={tmp_path / 'rec1'}"])
    curve = train_harness.train_curve(got)
    assert [row["train/weight_version"] for row in curve] == [1.0, 2.0, 3.0, 4.0]
    assert curve[:3] == train_harness.train_curve(ref)
    assert (got / "trainer" / "rollout_3" / "policy.safetensors").is_file()
    assert "trainer state loaded from" in (got / "run.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("whom", ["driver", "process group"])
def test_sigterm_stops_a_run_with_workers_as_ctrl_c_does(policy, tmp_path, whom):
    """SIGTERM (a scheduler's stop, `kill`, `timeout`) to the driver of 2 Ray workers while it is
    about to train rollout 1: Ray's own SIGTERM handler (exit 1, no clean-up) does not take it; the
    run ends with 143 within seconds, prints the resume command, releases its lock, and its
    workers are gone. To the whole process group (`timeout` without --foreground, SLURM's
    `scancel`), the local Ray's GCS and raylet stop with the run. Its clean-up skips removing the
    placement group (the local Ray goes down with it): that waited 60 s on the exiting GCS, then
    Ray ended the run with exit code 1. It ends within seconds, either as above or, where Ray's
    core worker touches the dead raylet first (it then exits at once with code 1), without the
    hint, its lock left to the next run to take over; the checkpoint is whole either way."""
    import signal

    data = harness.write_prompts(tmp_path / "prompts.jsonl", NUM_PROMPTS)
    args = args_for(data, policy)
    got = tmp_path / "stopped"
    code, log, pids, took = train_harness.stop_driver(args, got, tmp_path / "marks.txt", nth=2,
                                                      signum=signal.SIGTERM, pause=1.5,
                                                      group=whom == "process group")
    assert took < 40, f"{took:.0f} s from SIGTERM to exit"
    assert "Traceback" not in log and "KeyboardInterrupt" not in log and "SIGTERM received" not in log, log[-3000:]
    assert code == 143 or (whom == "process group" and code == 1), log[-3000:]
    if code == 143:
        assert "interrupted (SIGTERM): the newest checkpoint is" in log
        assert f"python run.py resume={got}" in log
        assert (got / "run.lock").read_text() == ""
    assert sorted(pids) == [0, 1]
    deadline = time.monotonic() + 20
    while any(train_harness.alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids.values() if train_harness.alive(pid)], "trainer workers outlived the run"
    # rollout 0 checkpointed whole, sharded trainer state included, as for a killed worker (whose
    # test above resumes such a run); test_run_dir.py resumes a run stopped by SIGTERM
    assert sorted(p.name for p in (got / "checkpoints").glob("rollout_*.json")) == ["rollout_0.json"]
    assert (got / "trainer" / "rollout_0" / ".metadata").is_file()
    assert not list((got / "trainer").glob(".rollout_*"))
    assert [row["step"] for row in train_harness.train_curve(got)] == [0]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_async_training_with_workers_feeds_ray_replicas_through_the_object_store(policy, tmp_path):
    """train_async with 2 workers and engine=ray: each update reaches the replica as the Ray
    object rank 0 gathered the weights into, one version behind the trainer."""
    import json

    data = harness.write_prompts(tmp_path / "prompts.jsonl", NUM_PROMPTS)
    run = tmp_path / "run"
    args = [a for a in args_for(data, policy) if not a.startswith(("engine.num_threads", "engine.max_batch_size",
                                                                  "engine=", "save_interval"))]
    harness.run_to_end(args + ["engine=ray", "engine.num_replicas=1", "train_async=true", "save_interval=2",
                               f"hydra.run.dir={run}"])
    curve = train_harness.train_curve(run)
    assert [row["train/weight_version"] for row in curve] == [1.0, 2.0, 3.0]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(row["perf/weight_sync_time"] > 0 for row in rows)
    versions = [{int(v) for s in harness.read_dump(run / f"samples/rollout_{r}.jsonl") for v in s["weight_versions"]}
                for r in range(NUM_ROLLOUT)]
    # one step off: rollout 1 made by version 0 while rollout 0 trained; rollout 1 is a
    # checkpoint (a barrier), so rollout 2 is made by version 2
    assert versions == [{0}, {0}, {2}], versions
    assert "ray engine: 1 replicas updated to weight version 2" in (run / "run.log").read_text() or \
        "engine now serves weight version 2" in (run / "run.log").read_text()
