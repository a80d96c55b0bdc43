"""pipeline.run.app.run in-process on composed configs: sinks lifecycle, failures, resume errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.run.app import run
from pipeline.config.args import ConfigError
from pipeline.sinks.jsonl import MetricsJsonl, read_metrics
from tests.plugins import fakes

CONF = Path(__file__).resolve().parents[1] / "conf"


def _cfg(tmp_path: Path, *extra: str):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": f"What is {i} + 1?", "label": str(i + 1)}) + "\n" for i in range(20)))
    overrides = [f"paths.output_dir={tmp_path}/run", f"data_source.prompt_data={data}", "rollout_batch_size=2",
                 "n_samples_per_prompt=2", "num_rollout=3", "allowed_targets_extra=[tests.]", "rollout=function",
                 "engine=scripted",
                 "rollout.path=tests.plugins.slime_plugins.generate_rollout", "logger=jsonl", "~logger.keys",
                 "logger._target_=tests.plugins.fakes.RecordingSink", *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.timeout(60)
def test_run_logs_every_step_to_sinks_and_finishes(tmp_path):
    last = run(_cfg(tmp_path))
    kinds = [e[0] for e in fakes.EVENTS]
    assert kinds == ["start", "log", "log", "log", "finish"]
    start = fakes.EVENTS[0][1]
    assert start["run_dir"] == str(tmp_path / "run") and start["group"] is None and start["resume"] is False
    assert start["config"]["rollout_batch_size"] == 2 and "hydra" not in start["config"]
    assert [e[1][0] for e in fakes.EVENTS if e[0] == "log"] == [0, 1, 2]
    assert fakes.EVENTS[-1] == ("finish", 0)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert last == {k: v for k, v in rows[-1].items() if k != "step"} == fakes.EVENTS[3][1][1]


@pytest.mark.timeout(60)
def test_failure_still_finishes_sinks_marked_failed(tmp_path):
    with pytest.raises(RuntimeError, match="boom at rollout 1"):
        run(_cfg(tmp_path, "rollout.path=tests.plugins.fakes.failing_rollout"))
    assert fakes.EVENTS[-1] == ("finish", 1)
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [0]


@pytest.mark.timeout(60)
def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="resume: '.*empty' is not a run dir"):
        run(_cfg(tmp_path, f"resume={tmp_path}/empty"))
    (tmp_path / "empty" / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="resume: no valid checkpoint in .*empty/checkpoints"):
        run(_cfg(tmp_path, f"resume={tmp_path}/empty"))


@pytest.mark.timeout(60)
def test_resume_continues_in_the_same_run_dir(tmp_path):
    run(_cfg(tmp_path, "num_rollout=2"))
    run(_cfg(tmp_path, "num_rollout=4", f"resume={tmp_path}/run", f"paths.output_dir={tmp_path}/elsewhere"))
    assert fakes.EVENTS[0][1]["resume"] is True
    assert [e[1][0] for e in fakes.EVENTS if e[0] == "log"] == [2, 3]
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2, 3]
    assert not (tmp_path / "elsewhere" / "metrics.jsonl").exists()


class _Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not an Exception, so no handler catches it)."""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("killed_at", [0, 1])
def test_a_run_killed_between_checkpoint_and_metrics_line_gets_the_line_back_on_resume(
        killed_at, tmp_path, monkeypatch, caplog):
    lost: dict = {}
    real_log = MetricsJsonl.log

    def killed(self, step, metrics):
        if step == killed_at:
            lost.update(metrics)
            raise _Killed
        real_log(self, step, metrics)

    with monkeypatch.context() as m:
        m.setattr(MetricsJsonl, "log", killed)
        with pytest.raises(_Killed):
            run(_cfg(tmp_path, f"num_rollout={killed_at + 1}"))
    run_dir = tmp_path / "run"
    assert (run_dir / "checkpoints" / f"rollout_{killed_at}.json").exists()
    metrics = run_dir / "metrics.jsonl"
    assert (not metrics.exists()) if killed_at == 0 else [r["step"] for r in read_metrics(metrics)] == [0]
    caplog.set_level("WARNING", logger="pipeline.loop.runner")
    run(_cfg(tmp_path, "num_rollout=3", f"resume={run_dir}"))
    rows = read_metrics(metrics)
    assert [r["step"] for r in rows] == [0, 1, 2]
    # the restored line is the one that was lost, less the checkpoint's own time (measured after it)
    assert {k: v for k, v in rows[killed_at].items() if k != "step"} == {
        k: v for k, v in lost.items() if k != "perf/stage/checkpoint_time"}
    # and the sinks get its row first
    assert [e[1][0] for e in fakes.EVENTS if e[0] == "log"] == list(range(killed_at, 3))
    assert f"had no line for rollout {killed_at}" in caplog.text
    # a second resume finds the line and restores nothing
    caplog.clear()
    run(_cfg(tmp_path, "num_rollout=4", f"resume={run_dir}"))
    assert [r["step"] for r in read_metrics(metrics)] == [0, 1, 2, 3]
    assert "had no line" not in caplog.text
