"""Train data carries slime's keys (slime/ray/rollout.py `_convert_samples_to_train_data`) so
slime's trainer-side code reads it unchanged; round trip through the run-dir files."""

from __future__ import annotations

from types import SimpleNamespace

import pipeline
from pipeline.samples.sample import Sample
from pipeline.sinks.files import write_train_data
from pipeline.sinks.files import to_tensors
from pipeline.stages.train_data import convert_to_train_data

# the per-sample keys slime's RolloutManager hands to its trainer (its _split_train_data_by_dp list)
SLIME_SPLIT_KEYS = {"tokens", "multimodal_train_inputs", "response_lengths", "rewards", "truncated", "loss_masks",
                    "round_number", "sample_indices", "rollout_ids", "rollout_mask_sums", "rollout_log_probs",
                    "rollout_routed_experts", "source_names", "teacher_log_probs"}


def _sample(i: int, **kw) -> Sample:
    return Sample(index=i, tokens=[1, 2, 3], response_length=2, reward=float(i), **kw)


def test_minimal_samples_get_slime_defaults():
    td = convert_to_train_data(SimpleNamespace(), [_sample(0), _sample(1)], [0.0, 1.0], [-0.5, 0.5])
    assert td["source_names"] == ["unknown", "unknown"]
    assert td["raw_reward"] == [0.0, 1.0]
    for key in ("round_number", "metadata", "multimodal_train_inputs", "rollout_log_probs", "teacher_log_probs",
                "rollout_routed_experts", "train_metadata"):
        assert key not in td, key
    assert set(td) <= SLIME_SPLIT_KEYS | {"raw_reward"}


def test_metadata_driven_keys():
    samples = [
        _sample(0, metadata={"source_name": "gsm8k", "round_number": 2, "raw_reward": 0.25},
                train_metadata={"turns": 3}, multimodal_train_inputs={"pixel_values": [[0.5]]}),
        _sample(1, metadata={"round_number": 3}),
        _sample(2),
    ]
    samples[2].source = "from-attribute"   # slime's get_source looks at sample.source first
    td = convert_to_train_data(SimpleNamespace(), samples, [0.0, 1.0, 2.0], [0.0, 0.0, 0.0])
    assert td["source_names"] == ["gsm8k", "unknown", "from-attribute"]
    assert td["round_number"] == [2, 3, None]
    assert td["raw_reward"] == [0.25, 1.0, 2.0]          # metadata raw_reward where present
    assert td["metadata"] == [{"turns": 3}, None, None]   # slime's key for train_metadata
    assert td["multimodal_train_inputs"] == [{"pixel_values": [[0.5]]}, None, None]
    assert set(td) <= SLIME_SPLIT_KEYS | {"raw_reward", "metadata"}


def test_per_token_lists_when_every_sample_has_them(tmp_path):
    samples = [_sample(i, rollout_log_probs=[-0.1 * i, -0.2]) for i in range(3)]
    for s in samples:
        s.teacher_log_probs = [-1.0, -2.0]
    td = convert_to_train_data(SimpleNamespace(), samples, [0, 1, 2], [0, 0, 0])
    assert td["rollout_log_probs"][2] == [-0.2, -0.2] and td["teacher_log_probs"] == [[-1.0, -2.0]] * 3
    write_train_data(tmp_path / "rollout_0", td)
    back = pipeline.load_train_data(tmp_path / "rollout_0")
    assert back["source_names"] == td["source_names"] and back["rollout_log_probs"] == td["rollout_log_probs"]
    assert to_tensors(back)["rollout_log_probs"].shape == (3, 2)


def test_per_token_lists_are_plain_floats_and_expert_ids_stay_ints():
    import numpy as np

    samples = [_sample(i, rollout_log_probs=np.array([-1, -2], dtype=np.float32)) for i in range(2)]
    for s in samples:
        s.teacher_log_probs = [-3, -4]                   # ints from a plugin: floats in the train data
        s.rollout_routed_experts = np.array([[1, 2], [3, 4]])
    td = convert_to_train_data(SimpleNamespace(), samples, [0, 1], [0, 0])
    for key in ("rollout_log_probs", "teacher_log_probs"):
        assert all(type(x) is float for row in td[key] for x in row), key
    assert td["rollout_log_probs"] == [[-1.0, -2.0]] * 2 and td["teacher_log_probs"] == [[-3.0, -4.0]] * 2
    experts = td["rollout_routed_experts"]
    assert [[list(map(int, e)) for e in row] for row in experts] == [[[1, 2], [3, 4]]] * 2
    assert all(not isinstance(e, float) for row in experts for e in row)  # expert ids are not made floats


def test_raw_reward_from_metadata_when_every_sample_has_one():
    samples = [_sample(0, metadata={"raw_reward": 0.25}), _sample(1, metadata={"raw_reward": 0.75})]
    td = convert_to_train_data(SimpleNamespace(), samples, [0.0, 1.0], [0.0, 0.0])
    assert td["raw_reward"] == [0.25, 0.75]


def test_partial_per_token_lists_warn_naming_the_samples(caplog):
    samples = [_sample(i) for i in range(12)]
    samples[0].rollout_log_probs = [-0.5, -0.5]
    with caplog.at_level("WARNING", logger="pipeline.stages.train_data"):
        td = convert_to_train_data(SimpleNamespace(), samples, [0] * 12, [0] * 12)
    assert "rollout_log_probs" not in td
    assert [r.getMessage() for r in caplog.records] == [
        "rollout_log_probs present on 1 of 12 samples (missing on samples [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]); "
        "the train data leaves rollout_log_probs out for this rollout"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipeline.stages.train_data"):
        convert_to_train_data(SimpleNamespace(), samples[1:], [0] * 11, [0] * 11)  # none has them: no warning
    assert caplog.records == []


def test_a_plugins_own_sample_class_converts():
    """A rollout plugin may return its own sample objects (is_sample_like): a string status, no
    metadata dict, none of the newer optional attributes."""
    def plugin_sample(i: int, status: str) -> SimpleNamespace:
        return SimpleNamespace(index=i, tokens=[1, 2, 3], response_length=2, status=status, rollout_id=None,
                               loss_mask=None, remove_sample=False, metadata=None)

    td = convert_to_train_data(SimpleNamespace(), [plugin_sample(0, "truncated"), plugin_sample(1, "completed")],
                               [1, 0], [0.5, -0.5])
    assert td["truncated"] == [1, 0] and td["raw_reward"] == [1, 0] and td["source_names"] == ["unknown"] * 2
    for key in ("round_number", "metadata", "multimodal_train_inputs", "rollout_log_probs", "teacher_log_probs",
                "rollout_routed_experts"):
        assert key not in td, key
