"""train_async (pipeline.loop.runner_async) with the scripted engine and a function trainer: order,
per-token weight versions, the staleness bound, overlap, barriers at checkpoints, resume after a
crash with a rollout in flight, and the pre-flight checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.run.app import run
from pipeline.config.args import ConfigError, validate
from pipeline.samples.versions import token_versions
from pipeline.sinks.files import read_samples
from pipeline.sinks.jsonl import read_metrics
from tests.plugins import async_trainer

pytestmark = pytest.mark.timeout(120)

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(autouse=True)
def _fresh_events():
    async_trainer.EVENTS.clear()
    async_trainer.TRAIN_SECONDS[0] = 0.0
    yield
    async_trainer.EVENTS.clear()


# the trainer of these tests: a function trainer whose versions reach the scripted engine
TRAINER = ("trainer=function", "trainer._target_=tests.plugins.async_trainer.VersionedTrainer",
           "trainer.train_function_path=tests.plugins.async_trainer.record_train")


def compose_cfg(tmp_path: Path, run_dir: Path, *extra: str, trainer: tuple[str, ...] = TRAINER):
    data = tmp_path / "arith.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"input": f"What is {i} + {i + 2}?", "label": str(2 * i + 2)}) + "\n"
                                for i in range(40)))
    overrides = [f"paths.output_dir={run_dir}", f"data_source.prompt_data={data}", "engine=scripted",
                 "logger=jsonl", "rollout_batch_size=2", "n_samples_per_prompt=2", "rollout.progress=false",
                 "rollout.summary=false", "allowed_targets_extra=[tests.]", *trainer,
                 "extra_stages=[{path: tests.plugins.async_trainer.note_generated, after: generate}]",
                 "train_async=true", *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def events(kind: str) -> dict[int, tuple[float, float, object]]:
    return {rid: (start, end, detail) for k, rid, start, end, detail in async_trainer.EVENTS if k == kind}


def dump_versions(run_dir: Path, rollout_id: int) -> set[int | None]:
    """Every response token's weight version in rollout `rollout_id`'s sample dump."""
    return {v for s in read_samples(run_dir / "samples" / f"rollout_{rollout_id}.jsonl") for v in token_versions(s)}


def test_one_step_off_order_versions_staleness_and_overlap(tmp_path):
    async_trainer.TRAIN_SECONDS[0] = 0.4
    run_dir = tmp_path / "run"
    run(compose_cfg(tmp_path, run_dir, "num_rollout=5", "save_interval=null", "engine.token_delay=0.01"))
    gen, train = events("generate"), events("train")
    assert sorted(train) == [0, 1, 2, 3, 4]
    assert [rid for k, rid, *_ in async_trainer.EVENTS if k == "train"] == [0, 1, 2, 3, 4]  # trained in order
    assert all(detail[0].startswith("trainer") for _, _, detail in train.values())  # on the background thread
    # rollout r is generated while the engine serves version r - 1 (0 for the first two) ...
    assert [gen[r][2] for r in range(5)] == [0, 0, 1, 2, 3]
    # ... and every token of its sample dump records that version
    assert [dump_versions(run_dir, r) for r in range(5)] == [{0}, {0}, {1}, {2}, {3}]
    # generation of r + 1 ran while rollout r trained
    for r in range(4):
        assert gen[r + 1][0] < train[r][1] and train[r][0] < gen[r + 1][1], (r, gen[r + 1], train[r])
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2, 3, 4]
    assert [row["train/weight_version"] for row in rows] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [row["rollout/weight_staleness"] for row in rows] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert all(row["train/samples"] == 4.0 for row in rows)
    # training hidden behind generation (the next rollout's ~0.3 s or more), except for the last
    # rollout: only the previous rollout's logging and commit overlap it, the loop waits for the rest
    assert all(rows[r]["perf/async_overlap_time"] > 0.1 for r in range(4))
    assert rows[4]["perf/async_train_wait_time"] > rows[4]["perf/async_overlap_time"]
    for row in rows:
        assert row["perf/stage/train_time"] >= 0.4
        assert row["perf/async_overlap_time"] + row["perf/async_train_wait_time"] == pytest.approx(
            row["perf/stage/train_time"])
    # every prompt trained once, in rollout order
    indices = [detail[1] for _, _, detail in (train[r] for r in range(5))]
    flat = [i for batch in indices for i in batch]
    assert len(flat) == len(set(flat)) == 20


def test_the_bound_counts_weight_versions(tmp_path):
    run_dir = tmp_path / "run"
    run(compose_cfg(tmp_path, run_dir, "num_rollout=6", "save_interval=null", "max_weight_staleness=2"))
    gen = events("generate")
    assert [gen[r][2] for r in range(6)] == [0, 0, 0, 1, 2, 3]
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [row["rollout/weight_staleness"] for row in rows] == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert [row["train/weight_version"] for row in rows] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_a_checkpoint_is_a_barrier(tmp_path):
    run_dir = tmp_path / "run"
    run(compose_cfg(tmp_path, run_dir, "num_rollout=5", "save_interval=2"))
    gen = events("generate")
    # checkpoints after rollouts 1 and 3: each drains, so rollouts 2 and 4 start from fresh weights
    assert [gen[r][2] for r in range(5)] == [0, 0, 2, 2, 4]
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [row["rollout/weight_staleness"] for row in rows] == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert sorted(p.name for p in (run_dir / "trainer").iterdir()) == ["rollout_3", "rollout_4"]
    state = json.loads((run_dir / "trainer" / "rollout_3" / "trainer_state.json").read_text())
    assert state["weight_version"] == 4  # the trainer state of checkpoint 3 has trained rollout 3


def _dumps(run_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((run_dir / "samples").glob("rollout_*.jsonl"))}


def test_resume_after_a_crash_with_a_rollout_in_flight(tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    run(compose_cfg(tmp_path, whole, "num_rollout=6", "save_interval=2"))
    whole_trained = [detail[1] for k, _, _, _, detail in async_trainer.EVENTS if k == "train"]
    async_trainer.EVENTS.clear()

    crashed = tmp_path / "crashed"
    monkeypatch.setenv("ASYNC_TEST_FAIL_AT", "4")
    with pytest.raises(RuntimeError, match="training failed at rollout 4") as info:
        run(compose_cfg(tmp_path, crashed, "num_rollout=6", "save_interval=2"))
    assert any("rollout 4" in note and "train_async" in note for note in info.value.__notes__)
    # rollout 5 was generated (in flight) when training 4 failed; the last checkpoint is 3
    assert 5 in events("generate")
    assert [row["step"] for row in read_metrics(crashed / "metrics.jsonl")] == [0, 1, 2, 3]
    monkeypatch.delenv("ASYNC_TEST_FAIL_AT")
    first_part = [detail[1] for k, _, _, _, detail in async_trainer.EVENTS if k == "train"]
    async_trainer.EVENTS.clear()
    run(compose_cfg(tmp_path, crashed, "num_rollout=6", "save_interval=2", f"resume={crashed}"))
    resumed = [detail[1] for k, _, _, _, detail in async_trainer.EVENTS if k == "train"]
    # no prompt lost or trained twice: the same samples as the uninterrupted run, rollout by rollout
    assert first_part + resumed == whole_trained
    assert [row["step"] for row in read_metrics(crashed / "metrics.jsonl")] == [0, 1, 2, 3, 4, 5]
    assert _dumps(crashed) == _dumps(whole)


def test_deterministic_async_runs_repeat_exactly(tmp_path):
    cfg = ["num_rollout=4", "save_interval=null", "rollout.deterministic=true", "engine.token_delay_jitter=0.002"]
    run(compose_cfg(tmp_path, tmp_path / "a", *cfg))
    run(compose_cfg(tmp_path, tmp_path / "b", *cfg))
    assert _dumps(tmp_path / "a") == _dumps(tmp_path / "b")
    for r in range(4):
        a = (tmp_path / "a" / "train_data" / f"rollout_{r}.safetensors").read_bytes()
        assert a == (tmp_path / "b" / "train_data" / f"rollout_{r}.safetensors").read_bytes()


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer=none"], "train_async: true overlaps generation with training, but trainer=none trains nothing"),
    (["max_weight_staleness=0"], "max_weight_staleness: expected an integer >= 1"),
    (["max_weight_staleness=1.5"], "max_weight_staleness: expected an integer >= 1"),
    (["train_async=yes"], "train_async: expected true or false, got 'yes'"),
])
def test_preflight_refuses_what_cannot_work(tmp_path, overrides, message):
    trainer = () if overrides[0].startswith("trainer=") else TRAINER
    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg(tmp_path, tmp_path / "run", *overrides, trainer=trainer))


def test_preflight_warns_when_every_rollout_is_a_checkpoint(tmp_path, caplog):
    validate(compose_cfg(tmp_path, tmp_path / "run", "save_interval=1", "num_rollout=3"))
    assert "train_async: true with save_interval=1" in caplog.text
    caplog.clear()
    validate(compose_cfg(tmp_path, tmp_path / "run", "save_interval=5", "num_rollout=3"))
    assert "train_async" not in caplog.text
    validate(compose_cfg(tmp_path, tmp_path / "run", "train_async=false", "max_weight_staleness=2"))
    assert "max_weight_staleness=2 has no effect without train_async=true" in caplog.text


def test_preflight_warns_when_the_baseline_eval_would_be_replaced(tmp_path, caplog):
    validate(compose_cfg(tmp_path, tmp_path / "run", "eval=engine", "eval_before_train=true", "eval_interval=1"))
    assert "eval_before_train: true with eval_interval=1" in caplog.text
    caplog.clear()
    validate(compose_cfg(tmp_path, tmp_path / "run", "eval=engine", "eval_before_train=true", "eval_interval=2"))
    assert "eval_before_train" not in caplog.text
