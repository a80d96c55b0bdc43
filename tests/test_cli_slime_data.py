"""Through the CLI: slime's buffer-only data source (`data_source=slime`, built from args alone, no
prompt file) fed by a slime rollout function that fills every Sample field and sets slime's own
Status enum; then rollout=replay re-serves its dumps, and every field survives dump, checkpoint
and replay."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipeline
from pipeline.data.checkpoint import decode_groups, read_checkpoint
from pipeline.sinks.files import read_samples
from pipeline.sinks.jsonl import read_metrics
from tests.data.slime_samples import assert_same_sample
from tests.plugins.slime_data_plugins import expected
from tests.test_cli import data, run_cli  # noqa: F401 (the prompt-file fixture)

PLUGIN = "tests.plugins.slime_data_plugins.generate_rollout"
SIZES = ["logger=jsonl", "num_rollout=2", "rollout_batch_size=2", "n_samples_per_prompt=2", "engine=scripted"]


@pytest.mark.timeout(240)
def test_buffer_only_source_fed_by_a_slime_rollout_function_then_replayed(tmp_path: Path) -> None:
    run1 = tmp_path / "run1"
    run_cli(SIZES + ["data_source=slime", "rollout=function", f"rollout.path={PLUGIN}",
                     "allowed_targets_extra=[tests.]", f"hydra.run.dir={run1}"])
    assert [r["step"] for r in read_metrics(run1 / "metrics.jsonl")] == [0, 1]
    # rollout 0: groups 0, 1 (group 2 went to the buffer); rollout 1: group 2 from the buffer, then 3
    made_at = {0: 0, 1: 0, 2: 0, 3: 1}
    dumped = {r: read_samples(run1 / "samples" / f"rollout_{r}.jsonl") for r in (0, 1)}
    assert [[s.group_index for s in dumped[r]] for r in (0, 1)] == [[0, 0, 1, 1], [2, 2, 3, 3]]
    for s in dumped[0] + dumped[1]:
        assert_same_sample(s, expected(s.index, s.group_index, made_at[s.group_index]))
    assert [s.status for s in dumped[0]] == [pipeline.Sample.Status.TRUNCATED, pipeline.Sample.Status.COMPLETED,
                                             pipeline.Sample.Status.COMPLETED, pipeline.Sample.Status.TRUNCATED]
    buffer = decode_groups(read_checkpoint(run1 / "checkpoints" / "rollout_1.json")["buffer"])
    assert [[s.index for s in g] for g in buffer] == [[8, 9]]  # group 4, made at rollout 1
    for s in buffer[0]:
        assert_same_sample(s, expected(s.index, 4, 1))

    run2 = tmp_path / "run2"
    run_cli(SIZES + ["rollout=replay", f"rollout.source_dir={run1}", f"hydra.run.dir={run2}"])
    for r in (0, 1):
        replayed = read_samples(run2 / "samples" / f"rollout_{r}.jsonl")
        for got, want in zip(replayed, dumped[r], strict=True):
            assert_same_sample(got, want)
        assert pipeline.load_train_data(run2 / "train_data" / f"rollout_{r}") == \
            pipeline.load_train_data(run1 / "train_data" / f"rollout_{r}")


@pytest.mark.timeout(240)
def test_custom_generate_setting_slime_status(tmp_path: Path, data: Path) -> None:
    """A custom generate that sets slime's `Sample.Status` runs through every stage, persist included."""
    run = tmp_path / "run"
    run_cli(SIZES + [f"data_source.prompt_data={data}", "rollout.progress=false", "rollout.summary=false",
                     "rollout.custom_generate_path=tests.plugins.slime_data_plugins.generate_with_tool_turn",
                     "allowed_targets_extra=[tests.]", f"hydra.run.dir={run}"])
    for r in (0, 1):
        samples = read_samples(run / "samples" / f"rollout_{r}.jsonl")
        assert len(samples) == 4 and all(s.status is pipeline.Sample.Status.COMPLETED for s in samples)
        assert all(s.loss_mask[-2:] == [0, 0] and s.response.endswith(" [tool: ok]") for s in samples)
        # folded in from meta_info: without a trainer every rollout's weights are version 0
        assert all(s.weight_versions == ["0"] for s in samples)
        td = pipeline.load_train_data(run / "train_data" / f"rollout_{r}")
        assert td["truncated"] == [0, 0, 0, 0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_custom_generate_setting_slime_status_on_the_real_model(tmp_path: Path, data: Path) -> None:
    """The same custom generate on the bundled model (hf engine): real text, then the tool turn."""
    run = tmp_path / "run"
    run_cli(["logger=jsonl", "num_rollout=1", "rollout_batch_size=1", "n_samples_per_prompt=2",
             "rollout_max_response_len=8", f"data_source.prompt_data={data}", "rollout.progress=false",
             "rollout.summary=false", "allowed_targets_extra=[tests.]",
             "rollout.custom_generate_path=tests.plugins.slime_data_plugins.generate_with_tool_turn",
             f"hydra.run.dir={run}"], timeout=280)
    samples = read_samples(run / "samples" / "rollout_0.jsonl")
    assert len(samples) == 2 and all(s.status is pipeline.Sample.Status.COMPLETED for s in samples)
    for s in samples:
        assert s.response.endswith(" [tool: ok]") and s.response != " [tool: ok]"  # the model wrote first
        assert s.loss_mask == [1] * (s.response_length - 2) + [0, 0] and s.weight_versions == ["0"]
        assert len(s.rollout_log_probs) == s.response_length
