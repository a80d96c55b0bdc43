"""pipeline/train/prepared.py on its own: advantages (slime's GRPO-family default, a custom hook's),
the micro-batch a trainer cuts from prepared samples, and slime's custom loss with packed logits.
(The trainer's use of them: test_policy_gradient.py, test_policy_gradient_parallel.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.train.batches import TrainSamples
from pipeline.train.objective import MicroBatch
from pipeline.train.prepared import Prepared, advantages, custom_loss, empty_micro_batch, micro_batch

CPU = torch.device("cpu")
META = torch.device("meta")


def samples(rollout: bool = False, mask_sums: bool = False) -> TrainSamples:
    return TrainSamples(tokens=[torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6, 7]), torch.tensor([8, 9])],
                        response_lengths=[2, 3, 1],
                        loss_masks=[torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0])],
                        rewards=[0.5, -1.0, 2.0],
                        rollout_log_probs=[torch.full((n,), -0.1 * n) for n in (2, 3, 1)] if rollout else None,
                        rollout_mask_sums=[2.0, 2.0, 1.0] if mask_sums else None)


def test_the_default_advantage_is_the_reward_on_every_response_token_in_float32_on_the_device():
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = advantages(samples(), [None] * 3, None, None, None, CPU)
        on_meta = advantages(samples(), [None] * 3, None, None, None, META)
    finally:
        torch.set_default_dtype(default)
    assert [a.tolist() for a in out] == [[0.5, 0.5], [-1.0, -1.0, -1.0], [2.0]]
    assert all(a.dtype == torch.float32 for a in out + on_meta) and all(a.device == META for a in on_meta)


def test_a_custom_advantage_hook_gets_slimes_rollout_data_and_its_values_become_float32_on_the_device():
    s, old, ref, seen = samples(rollout=True), [torch.zeros(2), None, torch.ones(1)], [torch.ones(2)] * 3, []
    args = SimpleNamespace(name="args")

    def hook(hook_args, rollout_data):
        seen.append((hook_args, dict(rollout_data)))
        rollout_data["advantages"] = [[1, 2], [3, 4, 5], [6]]  # ints, in lists

    out = advantages(s, old, ref, hook, args, CPU)
    assert [a.tolist() for a in out] == [[1.0, 2.0], [3.0, 4.0, 5.0], [6.0]] and all(a.dtype == torch.float32
                                                                                     for a in out)
    (got_args, data), = seen
    assert got_args is args
    assert sorted(data) == ["advantages", "log_probs", "loss_masks", "ref_log_probs", "response_lengths",
                            "rewards", "rollout_log_probs", "tokens", "total_lengths"]
    assert data["rewards"] == [0.5, -1.0, 2.0] and isinstance(data["rewards"], list)
    assert data["log_probs"] is old and data["ref_log_probs"] is ref and data["tokens"] is s.tokens
    assert data["loss_masks"] is s.loss_masks and data["rollout_log_probs"] is s.rollout_log_probs
    assert data["response_lengths"] == [2, 3, 1] and data["total_lengths"] == [3, 4, 2]
    assert [a.tolist() for a in data["advantages"]] == [[0.5, 0.5], [-1.0, -1.0, -1.0], [2.0]]
    on_meta = advantages(s, old, ref, hook, args, META)
    assert all(a.device == META and a.dtype == torch.float32 for a in on_meta)


@pytest.mark.parametrize("optional", [False, True])
def test_a_micro_batch_takes_the_asked_samples_and_their_optional_tensors(optional):
    s = samples(rollout=optional, mask_sums=optional)
    ref = [torch.full((n,), 7.0 + i) for i, n in enumerate(s.response_lengths)] if optional else None
    p = Prepared(s, [torch.full((n,), float(i)) for i, n in enumerate(s.response_lengths)],
                 [None, torch.full((3,), -2.0), torch.full((1,), -3.0)], ref)
    batch, tokens = micro_batch(p, [2, 1])
    assert [t.tolist() for t in tokens] == [[8, 9], [4, 5, 6, 7]]
    assert (batch.response_lengths, batch.total_lengths) == ([1, 3], [2, 4])
    assert [m.tolist() for m in batch.loss_masks] == [[1.0], [1.0, 0.0, 1.0]]
    assert [a.tolist() for a in batch.advantages] == [[2.0], [1.0, 1.0, 1.0]]
    assert [o.tolist() for o in batch.old_log_probs] == [[-3.0], [-2.0, -2.0, -2.0]]
    if optional:
        assert [r.tolist() for r in batch.ref_log_probs] == [[9.0], [8.0, 8.0, 8.0]]
        assert [r.tolist() for r in batch.rollout_log_probs] == [[pytest.approx(-0.1)], [pytest.approx(-0.3)] * 3]
        assert batch.rollout_mask_sums == [1.0, 2.0]
    else:
        assert (batch.ref_log_probs, batch.rollout_log_probs, batch.rollout_mask_sums) == (None, None, None)
    assert micro_batch(p, [0])[0].old_log_probs == [None]  # a first-step sample: its forward gives them


def test_an_empty_micro_batch_has_one_masked_token_and_no_rollout_sums():
    p = Prepared(samples(mask_sums=True), [], [], None)
    batch, tokens = empty_micro_batch(p, CPU)
    assert batch.rollout_mask_sums is None and batch.ref_log_probs is None and batch.rollout_log_probs is None
    assert [t.tolist() for t in tokens] == [[0, 0]] and batch.loss_masks[0].tolist() == [0.0]


class Logits(torch.nn.Module):
    """A model whose logits are the token ids spread over 3 vocabulary entries; records its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[dict, object]] = []

    def forward(self, input_ids, attention_mask, use_cache):
        self.calls.append(({"ids": input_ids.tolist(), "mask": attention_mask.tolist(), "use_cache": use_cache},
                           torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")))
        x = input_ids.float().unsqueeze(-1) * torch.tensor([1.0, 10.0, 100.0])
        return SimpleNamespace(logits=x.to(torch.bfloat16) if torch.is_autocast_enabled("cpu") else x)


@pytest.mark.parametrize("bf16", [False, True])
def test_the_custom_loss_gets_slimes_batch_and_packed_float32_logits_of_one_padded_forward(bf16):
    s = samples(rollout=True, mask_sums=True)
    p = Prepared(s, [torch.ones(n) for n in s.response_lengths], [torch.zeros(n) for n in s.response_lengths],
                 [torch.ones(n) for n in s.response_lengths])
    batch, tokens = micro_batch(p, [1, 2])
    model, seen = Logits(), []
    args, reduce = SimpleNamespace(name="args"), object()

    def hook(hook_args, slime_batch, logits, reducer):
        seen.append((hook_args, slime_batch, logits, reducer))
        return "loss", {"m": 1}

    default = torch.get_autocast_dtype("cpu")
    torch.set_autocast_dtype("cpu", torch.float16)  # bf16 means bfloat16, whatever autocast's default
    try:
        assert custom_loss(hook, args, model, batch, tokens, reduce, CPU, bf16) == ("loss", {"m": 1})
    finally:
        torch.set_autocast_dtype("cpu", default)
    (call, dtype), = model.calls
    assert call == {"ids": [[4, 5, 6, 7], [8, 9, 0, 0]], "mask": [[1, 1, 1, 1], [1, 1, 0, 0]], "use_cache": False}
    assert dtype == (torch.bfloat16 if bf16 else False)
    (got_args, slime_batch, logits, reducer), = seen
    assert got_args is args and reducer is reduce
    assert logits.dtype == torch.float32 and logits.shape == (1, 6, 3)  # [1, sum(total_lengths), vocab]
    assert logits[0, :, 0].tolist() == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0]  # each sample's rows, padding cut
    assert slime_batch == {
        "unconcat_tokens": tokens, "total_lengths": [4, 2], "response_lengths": [3, 1],
        "loss_masks": batch.loss_masks, "advantages": batch.advantages, "log_probs": batch.old_log_probs,
        "ref_log_probs": batch.ref_log_probs, "rollout_log_probs": batch.rollout_log_probs,
        "rollout_mask_sums": [2.0, 1.0]}


def test_the_custom_loss_pads_on_the_trainers_device(monkeypatch):
    from pipeline.train import batches

    asked = []
    real = batches.pad_tokens
    monkeypatch.setattr(batches, "pad_tokens", lambda tokens, device=None: (asked.append(device),
                                                                            real(tokens, device=device))[1])
    s = samples()
    batch, tokens = micro_batch(Prepared(s, [torch.ones(n) for n in s.response_lengths], [None] * 3, None), [0])
    custom_loss(lambda *a: None, None, Logits(), batch, tokens, None, CPU, False)
    assert asked == [CPU]
    assert isinstance(batch, MicroBatch)
