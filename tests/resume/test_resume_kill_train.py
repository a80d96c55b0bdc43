"""SIGKILL a run WITH a trainer (trainer=policy_gradient, hf engine, a tiny random Llama) during
the train stage, during the trainer-state write and during the policy export; resume after each
kill. Deterministic mode: the final trainer state (weights, optimizer, RNG, weight version), the
loss curve, the train data, the sample dumps and the exported policy equal an uninterrupted
run's bit for bit (`train_harness.compare_training`, `harness.compare`)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402
import train_harness  # noqa: E402

NUM_ROLLOUT, NUM_PROMPTS, N = 3, 6, 2


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    return train_harness.tiny_policy(tmp_path_factory.mktemp("tiny_policy"))


# ~45 s of wall time on an idle machine (6 CLI processes); 4 min at a load average of 9
@pytest.mark.timeout(900)
def test_kills_during_training_trainer_state_and_export_resume_bit_identically(policy, tmp_path):
    data = harness.write_prompts(tmp_path / "prompts.jsonl", NUM_PROMPTS)
    args = train_harness.train_overrides(data, policy, NUM_ROLLOUT)
    ref = tmp_path / "ref"
    harness.run_to_end(args + [f"hydra.run.dir={ref}"])
    weight_versions = [row["train/weight_version"] for row in train_harness.train_curve(ref)]
    assert weight_versions == [1.0, 2.0, 3.0]
    assert json.loads((ref / f"trainer/rollout_{NUM_ROLLOUT - 1}/trainer_state.json").read_text())[
        "weight_version"] == NUM_ROLLOUT

    # marks count per process; two optimizer steps per rollout, two renames per trainer save
    kills = [
        ("train", 4),          # rollout 1, after its first optimizer step (weights half-updated in memory)
        ("trainer_state", 1),  # resumed from 0: rollout 1's state folder half-written (no trainer_state.json)
        ("trainer_state", 4),  # resumed from 0: rollout 2's complete state folder about to be renamed
        ("export", 1),         # resumed from 1: the final policy folder about to be renamed
    ]
    got, killed, resumes = harness.killed_run(tmp_path, args, kills, random.Random(0), timeout=300)
    assert killed == len(kills) and resumes == len(kills)
    assert train_harness.compare_training(ref, got, NUM_ROLLOUT) == []
    result = harness.compare(ref, got, NUM_ROLLOUT, data, NUM_PROMPTS, N, deterministic=True)
    assert result.problems == [] and (result.lost, result.duplicated) == (0, 0)
    assert result.groups_compared == NUM_ROLLOUT * 2
