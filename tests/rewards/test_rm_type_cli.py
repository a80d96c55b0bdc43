"""Through the CLI: a dataset whose rows pick different rm_types (slime's metadata["rm_type"]),
and a row with an unknown rm_type stopped by pre-flight before anything is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.rewards.text_rules import f1_reward, grade_gpqa
from pipeline.sinks.files import read_samples

ROOT = Path(__file__).resolve().parents[2]
TYPES = ["math", "deepscaler", "f1", "gpqa", "boxed_math", "random"]


def _data(path: Path, types: list[str]) -> Path:
    """Arithmetic prompts; f1 rows are labelled with words of the scripted answer, gpqa rows with a letter."""
    labels = {"f1": "the answer is", "gpqa": "B"}
    rows = [{"input": f"What is {i} + {i + 1}?", "label": labels.get(t, str(2 * i + 1)), "metadata": {"rm_type": t}}
            for i, t in enumerate(types)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cli(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HYDRA_FULL_ERROR="1")
    return subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.timeout(300)
def test_rows_pick_their_own_rm_type(tmp_path: Path) -> None:
    data = _data(tmp_path / "mixed.jsonl", TYPES * 2)
    run_dir = tmp_path / "run"
    proc = _cli(["engine=scripted", "engine.correct_rate=1.0", "logger=jsonl", f"data_source.prompt_data={data}",
                 "rollout_batch_size=6", "n_samples_per_prompt=2", "num_rollout=2", "rollout_max_response_len=256",
                 "rollout.progress=false",
                 "rollout.summary=false", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    samples = [s for r in (0, 1) for s in read_samples(run_dir / "samples" / f"rollout_{r}.jsonl")]
    assert {s.metadata["rm_type"] for s in samples} == set(TYPES)
    for s in samples:
        rm_type, reward = s.metadata["rm_type"], s.reward
        right = str(sum(int(x) for x in s.prompt.split("What is ")[1].split("?")[0].split(" + ")))
        assert r"\boxed{" + right + "}" in s.response       # the scripted engine answered right
        expected = {"math": 1.0, "boxed_math": 1.0, "deepscaler": 0.0,  # no </think>: deepscaler gives 0
                    "f1": f1_reward(s.response, s.label), "gpqa": grade_gpqa(s.response, s.label, s.metadata)}
        if rm_type == "random":
            assert reward in (0, 1)
        else:
            assert reward == pytest.approx(expected[rm_type]), (rm_type, s.response, reward)
    assert 0.0 < min(s.reward for s in samples if s.metadata["rm_type"] == "f1") < 1.0


@pytest.mark.timeout(120)
def test_unknown_rm_type_in_a_row_stops_at_pre_flight(tmp_path: Path) -> None:
    data = _data(tmp_path / "bad.jsonl", ["math", "f1", "gsm8k", "math"])
    run_dir = tmp_path / "run"
    proc = _cli([f"data_source.prompt_data={data}", "logger=jsonl", f"hydra.run.dir={run_dir}"])  # the real hf engine
    assert proc.returncode != 0
    assert "invalid configuration" in proc.stderr                   # validate(), before anything is built
    assert f"{data} line 3" in proc.stderr and "unknown rm_type 'gsm8k'" in proc.stderr
    assert "known: math, deepscaler, dapo, f1, gpqa, ifbench, random, remote, remote_rm" in proc.stderr
    assert not (run_dir / "train_data").exists() and not (run_dir / "metrics.jsonl").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rows_pick_their_own_rm_type_with_the_real_model(tmp_path: Path) -> None:
    """The same through the default hf engine (SmolLM2): each reward is its row's grader on the response."""
    from pipeline.rewards.math import grade

    data = _data(tmp_path / "mixed.jsonl", ["math", "f1", "gpqa", "boxed_math"])
    run_dir = tmp_path / "run"
    proc = _cli(["logger=jsonl", f"data_source.prompt_data={data}", "data_source.shuffle=false", "rollout_batch_size=4",
                 "n_samples_per_prompt=2", "num_rollout=1", "rollout_max_response_len=24", "rollout.progress=false",
                 "rollout.summary=false", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    samples = read_samples(run_dir / "samples" / "rollout_0.jsonl")
    assert sorted({s.metadata["rm_type"] for s in samples}) == ["boxed_math", "f1", "gpqa", "math"]
    for s in samples:
        rm_type = s.metadata["rm_type"]
        expected = {"math": lambda: grade(s.response, s.label), "boxed_math": lambda: grade(s.response, s.label, True),
                    "f1": lambda: f1_reward(s.response, s.label),
                    "gpqa": lambda: grade_gpqa(s.response, s.label, s.metadata)}[rm_type]()
        assert s.reward == pytest.approx(expected), (rm_type, s.response)
