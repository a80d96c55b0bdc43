"""AdamW and the learning-rate schedule (pipeline/train/optim.py): Megatron's warm-up from 0, the
decay styles between warm-up and lr_decay_iters, min_lr after that, and the refusals."""

from __future__ import annotations

import math
import re

import pytest
import torch

from pipeline.train.optim import LrSchedule, make_adamw


def exactly(message: str) -> str:
    """A pytest.raises pattern of the whole message (re.search would accept any text around it)."""
    return f"^{re.escape(message)}$"


def lrs(schedule: LrSchedule, steps: int) -> list[float]:
    return [schedule.at(s) for s in range(steps)]


def test_warmup_ramps_from_zero_then_constant():
    s = LrSchedule(1.0, 0.1, 4, None, "constant")
    assert lrs(s, 7) == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert type(s.at(1)) is float and type(s.at(5)) is float
    # no warm-up: the full rate from step 0
    assert lrs(LrSchedule(2, 0, 0, None, "linear"), 3) == [2.0, 2.0, 2.0]


def test_constant_style_ignores_the_decay_iters():
    assert lrs(LrSchedule(1.0, 0.1, 2, 4, "constant"), 6) == [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]


def test_linear_decay_reaches_min_lr_at_decay_iters_and_stays():
    s = LrSchedule(1.0, 0.2, 2, 6, "linear")
    assert lrs(s, 9) == pytest.approx([0.0, 0.5, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2], abs=1e-12)
    assert s.at(6) == 0.2 and s.at(100) == 0.2


def test_cosine_decay_follows_half_a_cosine_to_min_lr():
    s = LrSchedule(1.0, 0.2, 1, 5, "cosine")
    expected = [0.0] + [0.2 + 0.8 * (1 + math.cos(math.pi * p / 4)) / 2 for p in range(4)] + [0.2, 0.2]
    assert lrs(s, 7) == pytest.approx(expected, abs=1e-12)
    assert s.at(3) == pytest.approx(0.6, abs=1e-12)  # half-way: the mean of lr and min_lr


def test_decay_iters_equal_to_warmup_go_to_min_lr_at_once():
    s = LrSchedule(1.0, 0.3, 2, 2, "cosine")
    assert lrs(s, 4) == [0.0, 0.5, 0.3, 0.3]
    assert lrs(LrSchedule(1.0, 0.3, 0, 0, "linear"), 2) == [0.3, 0.3]


def test_bad_schedules_are_refused_naming_the_key():
    with pytest.raises(ValueError, match=exactly(
            "lr_decay_style must be one of ['constant', 'linear', 'cosine'], got 'step'")):
        LrSchedule(1.0, 0.0, 0, None, "step")
    with pytest.raises(ValueError, match=exactly("lr_decay_iters (2) must be >= lr_warmup_iters (3)")):
        LrSchedule(1.0, 0.0, 3, 2, "linear")
    LrSchedule(1.0, 0.0, 3, 3, "linear")  # equal is fine


def test_the_schedule_keeps_its_settings_as_numbers():
    s = LrSchedule(1, 0, 2.0, 5, "linear")
    assert (s.lr, s.min_lr, s.warmup, s.decay_iters, s.style) == (1.0, 0.0, 2, 5, "linear")
    assert (type(s.lr), type(s.min_lr), type(s.warmup)) == (float, float, int)


def test_apply_sets_the_rate_on_every_group_and_returns_it():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 9.0}], lr=5.0)
    s = LrSchedule(1.0, 0.0, 4, None, "constant")
    assert s.apply(optimizer, 2) == 0.5
    assert [g["lr"] for g in optimizer.param_groups] == [0.5, 0.5]


def test_adamw_takes_the_trainable_parameters_with_the_keys_hyper_parameters():
    frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    w, v = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(1))
    opt = make_adamw(iter([w, frozen, v]), 0.1, 0.01, 0.8, 0.95, 1e-6)
    assert isinstance(opt, torch.optim.AdamW)
    (group,) = opt.param_groups
    assert group["params"] == [w, v]
    assert (group["lr"], group["weight_decay"], group["betas"], group["eps"]) == (0.1, 0.01, (0.8, 0.95), 1e-6)
    assert group["fused"] is True


def test_adamw_steps_as_the_reference_adamw():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ours = make_adamw(params, 0.1, 0.05, 0.7, 0.9, 1e-3)
    theirs = torch.optim.AdamW(ref, lr=0.1, betas=(0.7, 0.9), eps=1e-3, weight_decay=0.05, foreach=False)
    for step in range(3):
        for p, q in zip(params, ref):
            p.grad = q.grad = torch.full_like(p, 0.5 * (step + 1)) * torch.arange(p.numel()).view_as(p)
        ours.step()
        theirs.step()
    for p, q in zip(params, ref):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)


def test_adamw_refuses_a_model_with_nothing_to_train():
    with pytest.raises(ValueError, match=exactly("the model has no trainable parameters")):
        make_adamw([torch.nn.Parameter(torch.zeros(1), requires_grad=False)], 0.1, 0.0, 0.9, 0.99, 1e-8)


def test_a_one_step_decay_gives_the_full_rate_at_its_first_step():
    assert lrs(LrSchedule(1.0, 0.2, 1, 2, "linear"), 3) == [0.0, 1.0, 0.2]
    assert lrs(LrSchedule(1.0, 0.2, 0, 1, "cosine"), 2) == [1.0, 0.2]
