"""The rollout loop: order of calls, eval / checkpoint cadence, stage timings, run-dir files."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import pipeline
from pipeline.loop.runner import Pipeline, Schedule
from pipeline.samples.sample import Sample
from pipeline.sinks.files import read_samples
from pipeline.sinks.jsonl import MetricsJsonl, read_metrics
from pipeline.stages import STAGES, StageParts

ARGS = SimpleNamespace(advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                       n_samples_per_prompt=2, rollout_batch_size=2, group_mode="slime", reward_key=None,
                       n_samples_per_eval_prompt=1)


class FakeSource:
    """Records the runner's calls; hands out groups with global counters."""

    def __init__(self):
        self.calls, self.groups, self.buffer = [], 0, []

    def begin_rollout(self, rollout_id):
        self.calls.append(("begin", rollout_id))

    def get_samples(self, n):
        out = []
        for _ in range(n):
            g = self.groups
            out.append([Sample(group_index=g, index=2 * g + j, prompt=f"q{g}", tokens=[1, 2, 3],
                               response_length=2, reward=float(j == 0)) for j in range(2)])
            self.groups += 1
        return out

    def save(self, rollout_id):
        self.calls.append(("save", rollout_id))

    def get_buffer_length(self):
        return len(self.buffer)


def rollout(args, rollout_id, data_source, evaluation=False):
    data_source.calls.append(("rollout", rollout_id, evaluation))
    return data_source.get_samples(args.rollout_batch_size)


def evaluate(args, rollout_id, data_source, evaluation=False):
    data_source.calls.append(("eval", rollout_id, evaluation))
    s = [Sample(index=i, reward=float(i % 2), status=Sample.Status.COMPLETED) for i in range(4)]
    return {"toy": {"rewards": [x.reward for x in s], "truncated": [False] * 4, "samples": s}}


def _run(tmp_path, **sched):
    ds = FakeSource()
    parts = StageParts(args=ARGS, data_source=ds, rollout_fn=rollout, run_dir=str(tmp_path))
    p = Pipeline(parts=parts, schedule=Schedule(**sched), metrics_file=MetricsJsonl(tmp_path / "metrics.jsonl"),
                 eval_fn=evaluate)
    return ds, p.run()


def test_loop_order_eval_and_checkpoint_cadence(tmp_path):
    ds, last = _run(tmp_path, start_rollout_id=1, num_rollout=6, save_interval=2, eval_interval=3,
                    eval_before_train=True)
    assert ds.calls == [
        ("eval", 1, True), ("begin", 1), ("rollout", 1, False), ("save", 1),
        ("begin", 2), ("rollout", 2, False), ("eval", 2, True),
        ("begin", 3), ("rollout", 3, False), ("save", 3),
        ("begin", 4), ("rollout", 4, False),
        ("begin", 5), ("rollout", 5, False), ("eval", 5, True), ("save", 5),  # last one always saved
    ]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # one object per step
    assert "eval/toy" in rows[0] and "eval/toy" in rows[1] and "eval/toy" not in rows[2]
    assert rows[0]["eval/toy"] == 0.5 and rows[0]["rollout/raw_reward"] == 0.5
    for name, _ in STAGES:
        assert rows[0][f"perf/stage/{name}_time"] >= 0
    assert last == {k: v for k, v in rows[-1].items() if k != "step"}


def test_run_dir_files(tmp_path):
    _run(tmp_path, start_rollout_id=0, num_rollout=2, eval_interval=2)
    td = pipeline.load_train_data(tmp_path / "train_data" / "rollout_1")
    assert td["sample_indices"] == [4, 5, 6, 7]
    assert td["rewards"] == pytest.approx([0.70710576, -0.70710576] * 2)
    t = pipeline.load_train_data(tmp_path / "train_data" / "rollout_1", as_tensors=True, pad_token_id=7)
    assert t["tokens"].shape == (4, 3) and t["loss_masks"].tolist() == [[1, 1]] * 4
    assert t["rewards"].tolist() == pytest.approx([0.70710576, -0.70710576] * 2)
    dumped = read_samples(tmp_path / "samples" / "rollout_1.jsonl")
    assert [(s.prompt, s.group_index, s.index) for s in dumped] == [
        ("q2", 2, 4), ("q2", 2, 5), ("q3", 3, 6), ("q3", 3, 7)]
    assert (tmp_path / "samples" / "eval_toy_1.jsonl").exists()


def test_stage_error_names_stage_and_rollout(tmp_path):
    ds = FakeSource()
    parts = StageParts(args=ARGS, data_source=ds, rollout_fn=lambda *a, **k: [[]], run_dir=str(tmp_path))
    p = Pipeline(parts=parts, schedule=Schedule(0, 1), metrics_file=MetricsJsonl(tmp_path / "m.jsonl"))
    with pytest.raises(Exception) as err:
        p.run()
    assert "in stage 'flatten' of rollout 0" in "".join(getattr(err.value, "__notes__", []))


def test_schedule_rules():
    s = Schedule(start_rollout_id=0, num_rollout=5, save_interval=None, eval_interval=2)
    assert [r for r in range(5) if s.should_save(r)] == [4]
    assert [r for r in range(5) if s.should_eval(r)] == [1, 3]
