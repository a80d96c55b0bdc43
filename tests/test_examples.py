"""The plugin examples in examples/ (docs/plugins.md), each run through the CLI with the
scripted engine in both forms: native (YAML `_target_` via hydra.searchpath) and slime (dotted path)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # examples/ is a folder of the repo, not an installed package

from examples.buffer_filter import ShortestFirst, newest_first  # noqa: E402
from examples.dynamic_filter import DropTooEasy, drop_all_wrong  # noqa: E402
from examples.reward import BrevityReward, brevity_math, final_answer  # noqa: E402
from pipeline.samples.sample import Sample  # noqa: E402

SMALL = ["experiment=smoke", "allowed_targets_extra=[examples.]", "num_rollout=3"]
NATIVE = "hydra.searchpath=[file://examples/conf]"


def run_cli(run_dir: Path, *overrides: str) -> list[dict]:
    """Run `python run.py` with `overrides` into `run_dir`; returns the metrics rows."""
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "run.py", *SMALL, *overrides, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def dumped(run_dir: Path) -> list[list[dict]]:
    """The sample dumps of each rollout, in rollout order."""
    files = sorted((run_dir / "samples").glob("rollout_*.jsonl"), key=lambda p: int(p.stem.split("_")[1]))
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in files]


def groups_of(samples: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for s in samples:
        out.setdefault(s["group_index"], []).append(s)
    return out


def expected_brevity(s: dict, penalty: float = 0.005, free: int = 16) -> float:
    right = final_answer(s["response"]) == str(s["label"]).strip()
    return 1.0 - penalty * max(0, s["response_length"] - free) if right else 0.0


@pytest.mark.timeout(150)
def test_native_buffer_filter_dynamic_filter_and_reward(tmp_path):
    run = tmp_path / "native"
    rows = run_cli(run, NATIVE, "data_source=buffered", "filter=shortest_first", "dynamic_filter=too_easy",
                   "reward=brevity", "over_sampling_batch_size=4")
    assert [r["step"] for r in rows] == [0, 1, 2]
    rollouts = dumped(run)
    samples = [s for r in rollouts for s in r]
    assert samples and all(s["reward"] == pytest.approx(expected_brevity(s)) for s in samples)
    assert any(0 < s["reward"] < 1 for s in samples), "the length penalty never applied"
    for r in rollouts:  # every kept group passed DropTooEasy(0.75)
        for group in groups_of(r).values():
            assert sum(s["reward"] > 0 for s in group) / len(group) <= 0.75
    served = [s for s in samples if s["metadata"].get("buffer_filter") == "shortest_first"]
    assert served, "nothing was served from the buffer by the example filter"
    state = (run / "checkpoints" / "rollout_2.json").read_bytes().splitlines()[1]
    assert json.loads(state)["buffer_filter"]["served"] >= len(groups_of(served))


@pytest.mark.timeout(150)
def test_slime_form_by_dotted_path(tmp_path):
    run = tmp_path / "slime"
    rows = run_cli(run, "data_source=buffered", "filter.path=examples.buffer_filter.newest_first",
                   "dynamic_filter.path=examples.dynamic_filter.drop_all_wrong", "reward=custom",
                   "reward.custom_rm_path=examples.reward.brevity_math", "over_sampling_batch_size=4")
    assert len(rows) == 3
    samples = [s for r in dumped(run) for s in r]
    assert all(s["reward"] == pytest.approx(expected_brevity(s)) for s in samples)
    for group in groups_of(samples).values():
        assert any(s["reward"] > 0 for s in group)
    assert any(s["metadata"].get("buffer_filter") == "newest_first" for s in samples)


@pytest.mark.timeout(150)
def test_rollout_functions_both_forms(tmp_path):
    rows = run_cli(tmp_path / "oracle", "rollout=function", "rollout.path=examples.rollout.oracle_rollout")
    assert all(r["rollout/oracle_fraction"] == 0.5 and r["rollout/raw_reward"] == 0.5 for r in rows)
    oracle = [s for r in dumped(tmp_path / "oracle") for s in r]
    assert len(oracle) == 3 * 2 * 2 and all((s["index"] % 2 == 0) == (s["reward"] == 1.0) for s in oracle)
    rows = run_cli(tmp_path / "seq", NATIVE, "rollout=sequential", "reward=brevity")
    seq = dumped(tmp_path / "seq")
    for row, samples in zip(rows, seq):
        assert row["rollout/sequential_tokens"] == sum(s["response_length"] for s in samples)
        assert all(s["reward"] == pytest.approx(expected_brevity(s)) for s in samples)


def _group(rewards: list[float], lengths: list[int] | None = None) -> list[Sample]:
    out = []
    for i, r in enumerate(rewards):
        s = Sample(index=i, prompt="p", label="1")
        s.reward = r
        s.response_length = (lengths or [1] * len(rewards))[i]
        out.append(s)
    return out


def test_buffer_filters_take_and_remove_what_they_return():
    args = SimpleNamespace(reward_key=None)
    buffer = [_group([0.0], [9]), _group([0.0], [2]), _group([0.0], [5])]
    first = buffer[1]
    out = ShortestFirst()(args, 0, buffer, 2)
    assert out[0] is first and len(out) == 2 and len(buffer) == 1 and buffer[0][0].response_length == 9
    buffer = [_group([0.0]), _group([1.0])]
    last = buffer[1]
    assert newest_first(args, 0, buffer, 1) == [last] and len(buffer) == 1


def test_dynamic_filters_and_rewards_directly():
    args = SimpleNamespace(reward_key=None)
    assert not drop_all_wrong(args, _group([0.0, 0.0])).keep
    assert drop_all_wrong(args, _group([0.0, 1.0])).keep
    assert DropTooEasy(0.5)(args, _group([1.0, 1.0, 0.0])).reason == "too_easy"
    with pytest.raises(ValueError, match="max_correct_fraction"):
        DropTooEasy(2.0)
    s = Sample(index=0, prompt="p", label="7", response="so \\boxed{7}", response_length=20)
    assert asyncio.run(brevity_math(None, s)) == pytest.approx(0.98)
    assert asyncio.run(BrevityReward(0.1, 18).score(None, [s])) == [pytest.approx(0.8)]
