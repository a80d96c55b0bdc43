"""Train data as a trainer receives it: every per-sample column as a tensor of the right dtype,
train_metadata passed through, truncation read from enum or string statuses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.samples.sample import Sample
from pipeline.sinks.files import _pad, to_tensors
from pipeline.stages.train_data import convert_to_train_data

pytestmark = pytest.mark.timeout(30)

ARGS = SimpleNamespace(n_samples_per_prompt=2, rollout_batch_size=1, reward_key=None)


def batch() -> list[Sample]:
    a = Sample(group_index=0, index=4, tokens=[5, 6, 7], response_length=2, reward=1.0,
               status=Sample.Status.TRUNCATED, train_metadata={"lang": "en"})
    b = Sample(group_index=0, index=5, tokens=[5, 8], response_length=1, reward=0.0, status="truncated")
    return [a, b]


def test_every_column_becomes_a_tensor_of_its_dtype():
    td = convert_to_train_data(ARGS, batch(), [1.0, 0.0], [0.5, -0.5])
    assert td["truncated"] == [1, 1]  # an enum and a plain string status
    assert td["metadata"] == [{"lang": "en"}, None]  # slime's key for train_metadata
    t = to_tensors(td)
    expected = {"tokens": torch.long, "attention_mask": torch.long, "loss_masks": torch.long,
                "response_lengths": torch.long, "truncated": torch.long, "rollout_ids": torch.long,
                "rollout_mask_sums": torch.long, "rewards": torch.float32, "raw_reward": torch.float32,
                "sample_indices": torch.long}
    assert {k: v.dtype for k, v in t.items()} == expected
    assert t["response_lengths"].tolist() == [2, 1] and t["truncated"].tolist() == [1, 1]
    assert t["raw_reward"].tolist() == [1.0, 0.0] and t["rewards"].tolist() == [0.5, -0.5]
    assert t["sample_indices"].tolist() == [4, 5]
    assert t["rollout_ids"].tolist() == td["rollout_ids"]
    assert t["rollout_mask_sums"].tolist() == td["rollout_mask_sums"]


def test_without_train_metadata_the_key_is_absent_and_unknown_indices_are_skipped():
    s = batch()
    for x in s:
        x.train_metadata = None
    td = convert_to_train_data(ARGS, s, [1.0, 0.0], [0.5, -0.5])
    assert "metadata" not in td
    td["sample_indices"] = [None, 5]
    assert "sample_indices" not in to_tensors(td)
    del td["sample_indices"]
    assert to_tensors(td)["tokens"].shape == (2, 3)


def test_pad_shapes_and_dtypes():
    empty = _pad([], 0, torch.long)
    assert empty.shape == (0, 0) and empty.dtype == torch.long
    out = _pad([[0.5], [], [1.5, 2.5]], -1.0, torch.float32)
    assert out.dtype == torch.float32 and out.tolist() == [[0.5, -1.0], [-1.0, -1.0], [1.5, 2.5]]
    assert _pad([[1, 2]], 9, torch.long).dtype == torch.long


def test_integer_rewards_and_the_default_padding():
    td = convert_to_train_data(ARGS, batch(), [1, 0], [1, -1])  # a rule-based reward gives ints
    t = to_tensors(td)
    assert t["raw_reward"].dtype == t["rewards"].dtype == torch.float32
    assert t["raw_reward"].tolist() == [1.0, 0.0] and t["rewards"].tolist() == [1.0, -1.0]
    assert t["tokens"].tolist() == [[5, 6, 7], [5, 8, 0]]  # padded with token id 0 unless told
