"""SIGKILL the CLI at named moments (generation, reward, train-data write, checkpoint write) and
resume: the train data must match an uninterrupted run (see `harness` for what is compared)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402

NUM_ROLLOUT, NUM_PROMPTS, N = 6, 10, 3


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return harness.write_prompts(tmp_path_factory.mktemp("resume_data") / "prompts.jsonl", NUM_PROMPTS)


@pytest.mark.timeout(120)
def test_deterministic_kill_and_resume_matches_uninterrupted(data, tmp_path):
    """Two uninterrupted runs (random per-token jitter) give identical dumps; a run killed during a
    checkpoint write, between a checkpoint and its metrics line, during a reward call and at a
    random moment, resumed each time, gives the same batches, prompts per epoch, metrics lines,
    final buffer and byte-identical sample dumps."""
    ref, ref2 = tmp_path / "ref", tmp_path / "ref2"
    harness.run_to_end(harness.overrides(data, NUM_ROLLOUT, True) + [f"hydra.run.dir={ref}"])
    harness.run_to_end(harness.overrides(data, NUM_ROLLOUT, True) + [f"hydra.run.dir={ref2}"])
    same = harness.compare(ref, ref2, NUM_ROLLOUT, data, NUM_PROMPTS, N, deterministic=True)
    assert same.problems == [] and same.lost == same.duplicated == 0

    kills = [("checkpoint", 2), ("committed", 1), ("reward", 20), ("random", 1)]
    got, killed, resumes = harness.killed_run(tmp_path, harness.overrides(data, NUM_ROLLOUT, True), kills,
                                                 random.Random(0))
    assert killed == len(kills) and resumes >= 2
    result = harness.compare(ref, got, NUM_ROLLOUT, data, NUM_PROMPTS, N, deterministic=True)
    assert result.problems == []
    assert result.groups_compared == NUM_ROLLOUT * 3
    assert (result.lost, result.duplicated) == (0, 0)


@pytest.mark.timeout(90)
def test_kill_during_train_data_write_loses_and_repeats_nothing(data, tmp_path):
    """Not deterministic, no dynamic filter: after kills mid-generation and mid train-data write,
    every group taken from the data was consumed exactly once or is still in the buffer."""
    args = harness.overrides(data, NUM_ROLLOUT, False, dynamic_filter="none")
    # three atomic renames per rollout (train data, its JSON side file, the sample dump)
    kills = [("persist", 5), ("generate", 25)]
    run_dir, killed, resumes = harness.killed_run(tmp_path, args, kills, random.Random(1))
    assert killed == 2 and resumes >= 1
    taken, lost, duplicated = harness.accounting(run_dir, NUM_ROLLOUT, data, N)
    assert taken >= NUM_ROLLOUT * 3 and (lost, duplicated) == (0, 0)


@pytest.mark.timeout(90)
def test_adaptive_over_sampling_state_survives_a_kill(data, tmp_path):
    """The adaptive pass-rate estimate travels in the checkpoint: after kills the fetch sizes,
    the estimate and the buffer match the uninterrupted run (deterministic mode)."""
    args = harness.overrides(data, NUM_ROLLOUT, True, over_sampling="adaptive")
    ref = tmp_path / "ref"
    harness.run_to_end(args + [f"hydra.run.dir={ref}"])
    got, killed, _ = harness.killed_run(tmp_path, args, [("checkpoint", 2), ("checkpoint", 3)], random.Random(2))
    assert killed == 2
    result = harness.compare(ref, got, NUM_ROLLOUT, data, NUM_PROMPTS, N, deterministic=True)
    assert result.problems == [] and (result.lost, result.duplicated) == (0, 0)
