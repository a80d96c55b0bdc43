"""Run-dir files: pickle-free train data round trip, sample dumps, metrics.jsonl, sweep summary."""

from __future__ import annotations

import json

import pytest

import pipeline
from pipeline.samples.sample import Sample
from pipeline.sinks.files import read_samples, write_samples, write_train_data
from pipeline.sinks.jsonl import MetricsJsonl, read_metrics
from pipeline.sinks.summary import summarize_sweep


def test_train_data_round_trip_without_pickle(tmp_path):
    data = {
        "tokens": [[1, 2, 3], [4], []],
        "response_lengths": [2, 1, 0],
        "rewards": [0.7071057558059692, -0.5, 0.1],
        "raw_reward": [1, 0, 1],
        "sample_indices": [0, None, 2],
        "loss_masks": [[1, 1], [0], []],
        "rollout_log_probs": [[-0.1, -0.25], [-3.0], []],
        "custom": {"anything": ["json"]},
    }
    write_train_data(tmp_path / "train_data" / "rollout_3", data, meta={"rollout_id": 3})
    for suffix in ("", ".safetensors", ".json"):
        assert pipeline.load_train_data(f"{tmp_path}/train_data/rollout_3{suffix}") == data
    sidecar = json.loads((tmp_path / "train_data" / "rollout_3.json").read_text())
    assert sidecar["meta"] == {"rollout_id": 3}
    assert sidecar["keys"]["tokens"]["kind"] == "ragged"
    raw = (tmp_path / "train_data" / "rollout_3.safetensors").read_bytes()
    assert b"pickle" not in raw and not raw.startswith(b"\x80")  # safetensors header, not a pickle
    with pytest.raises(FileNotFoundError, match="no train data"):
        pipeline.load_train_data(tmp_path / "nope")


def test_sample_dump_round_trip(tmp_path):
    s = [Sample(group_index=0, index=i, prompt="p", tokens=[1, i], response_length=1, reward={"acc": 1.0},
                status=Sample.Status.TRUNCATED, metadata={"start_rollout_id": 2}) for i in range(3)]
    write_samples(tmp_path / "s.jsonl", s)
    lines = (tmp_path / "s.jsonl").read_text().splitlines()
    assert [json.loads(x)["status"] for x in lines] == ["truncated"] * 3
    assert read_samples(tmp_path / "s.jsonl") == s
    (tmp_path / "bad.jsonl").write_text('{"index": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_samples(tmp_path / "bad.jsonl")


def test_metrics_jsonl_truncate_for_resume(tmp_path):
    m = MetricsJsonl(tmp_path / "metrics.jsonl")
    for step in range(4):
        m.log(step, {"rollout/raw_reward": step / 10, "nan": float("nan")})
    m.truncate_from(2)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["rollout/raw_reward"] == 0.1
    assert rows[0]["nan"] is None


def test_sweep_summary_table(tmp_path):
    for job, reward in (("0", 0.25), ("1", 0.75)):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text(f"- data_source.seed={job}\n")
        m = MetricsJsonl(tmp_path / job / "metrics.jsonl")
        m.log(0, {"rollout/raw_reward": 0.0})
        m.log(1, {"rollout/raw_reward": reward, "eval/math": 0.5})
    md = summarize_sweep(tmp_path).read_text()
    assert "| job | overrides | step | rollout/raw_reward | eval/math |" in md
    assert "| 0 | data_source.seed=0 | 1 | 0.25 | 0.5 |" in md
    assert "| 1 | data_source.seed=1 | 1 | 0.75 | 0.5 |" in md
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert [r["metrics"]["rollout/raw_reward"] for r in rows] == [0.25, 0.75]
