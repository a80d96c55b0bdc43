"""The loss numerics against hand-computed vectors (expected values worked out here, by hand or
with `math`, never by calling the code under test)."""

import math
from types import SimpleNamespace

import pytest
import torch

from pipeline.train.losses import (
    batch_normalizer,
    compute_approx_kl,
    compute_cispo_loss,
    compute_gspo_kl,
    compute_policy_loss,
    sample_mean_reducer,
    vanilla_tis_function,
)


def t(values):
    return torch.tensor(values, dtype=torch.float64)


def kl_of_ratios(ratios):
    """ppo_kl = old - new = -log(ratio)."""
    return t([-math.log(r) for r in ratios])


def test_ppo_clip_asymmetric_bounds():
    # ratios, advantages; eps_clip 0.2 (low bound 0.8), eps_clip_high 0.28 (high bound 1.28)
    ratios = [0.5, 0.9, 1.0, 1.3, 1.5, 4.0]
    adv = t([1.0, -1.0, 2.0, 1.0, -2.0, 1.0])
    losses, clipfrac = compute_policy_loss(kl_of_ratios(ratios), adv, 0.2, 0.28)
    # max(-A r, -A clamp(r)): 0.5 with A>0 is not clipped from below (-0.5 > -0.8); 1.3 with A>0
    # is clipped to 1.28; 1.5 with A<0 keeps -A r = 3.0 (> 2.56); 4.0 with A>0 clips to 1.28
    assert losses.tolist() == pytest.approx([-0.5, 0.9, -2.0, -1.28, 3.0, -1.28])
    assert clipfrac.tolist() == [0.0, 0.0, 0.0, 1.0, 0.0, 1.0]


def test_ppo_clip_lower_bound_holds_a_falling_negative_advantage_token():
    # ratio 0.5 with A < 0: -A r = 0.5 but the clipped term -A * 0.8 = 0.8 wins (PPO is pessimistic)
    losses, clipfrac = compute_policy_loss(kl_of_ratios([0.5, 0.9]), t([-1.0, -1.0]), 0.2, 0.28)
    assert losses.tolist() == pytest.approx([0.8, 0.9])
    assert clipfrac.tolist() == [1.0, 0.0]


def test_clip_higher_lets_a_positive_token_rise_further_than_symmetric_clip():
    kl = kl_of_ratios([1.25])
    adv = t([1.0])
    symmetric, sym_frac = compute_policy_loss(kl, adv, 0.2, 0.2)
    higher, high_frac = compute_policy_loss(kl, adv, 0.2, 0.28)
    assert symmetric.item() == pytest.approx(-1.2) and sym_frac.item() == 1.0
    assert higher.item() == pytest.approx(-1.25) and high_frac.item() == 0.0


def test_dual_clip_caps_negative_advantage_losses_only():
    ratios = [4.0, 4.0, 1.5]
    adv = t([-1.0, 1.0, -2.0])
    plain, _ = compute_policy_loss(kl_of_ratios(ratios), adv, 0.2, 0.28)
    dual, _ = compute_policy_loss(kl_of_ratios(ratios), adv, 0.2, 0.28, eps_clip_c=3.0)
    # r=4, A=-1: -A r = 4.0, capped at -A * 3 = 3.0; A>0 untouched; r=1.5, A=-2: 3.0 < cap 6.0
    assert plain.tolist() == pytest.approx([4.0, -1.28, 3.0])
    assert dual.tolist() == pytest.approx([3.0, -1.28, 3.0])
    with pytest.raises(ValueError, match="eps_clip_c"):
        compute_policy_loss(kl_of_ratios(ratios), adv, 0.2, 0.28, eps_clip_c=1.0)


def test_dual_clip_accepts_any_bound_above_one_and_leaves_small_positive_advantages():
    # eps_clip_c 1.5 is valid; A = 0.5 > 0 at ratio 4 keeps its PPO loss -0.5 * 1.28 (the cap -0.75 is not applied)
    losses, _ = compute_policy_loss(kl_of_ratios([4.0, 4.0]), t([0.5, -1.0]), 0.2, 0.28, eps_clip_c=1.5)
    assert losses.tolist() == pytest.approx([-0.64, 1.5])


def test_ppo_gradient_is_zero_where_clipped():
    kl = kl_of_ratios([1.0, 1.5]).requires_grad_()
    adv = t([1.0, 1.0])
    losses, _ = compute_policy_loss(kl, adv, 0.2, 0.2)
    (grad,) = torch.autograd.grad(losses.sum(), kl)
    # d(-A exp(-kl))/dkl = A r = 1 at r=1; the clipped token has no gradient
    assert grad.tolist() == pytest.approx([1.0, 0.0])


def test_cispo_weights_log_probs_by_the_detached_clamped_ratio():
    kl = kl_of_ratios([0.5, 1.0, 1.5]).requires_grad_()
    log_probs = t([-1.0, -2.0, -0.5]).requires_grad_()
    adv = t([1.0, -1.0, 2.0])
    losses, clipfrac = compute_cispo_loss(kl, log_probs, adv, 0.2, 0.28)
    # weights clamp(r, 0.8, 1.28) = [0.8, 1.0, 1.28]; loss = -w A logp
    assert losses.tolist() == pytest.approx([0.8, -2.0, 1.28])
    assert clipfrac.tolist() == [1.0, 0.0, 1.0]
    g_logp, g_kl = torch.autograd.grad(losses.sum(), [log_probs, kl], allow_unused=True)
    assert g_logp.tolist() == pytest.approx([-0.8, 1.0, -2.56])
    assert g_kl is None  # no gradient through the ratio


def test_gspo_kl_is_the_masked_sequence_mean_repeated():
    new = [t([-1.0, -2.0, -3.0]).requires_grad_(), t([-0.2]), t([-1.0, -1.0])]
    old = [t([-1.5, -2.5, -0.3]), t([-0.1]), t([-4.0, -4.0])]
    masks = [t([1.0, 1.0, 0.0]), t([1.0]), t([0.0, 0.0])]
    kl = compute_gspo_kl(new, old, masks)
    # sample 0: ((-0.5) + (-0.5)) / 2 over its 3 tokens; sample 1: 0.1; sample 2 fully masked: 0
    assert kl.tolist() == pytest.approx([-0.5, -0.5, -0.5, 0.1, 0.0, 0.0])
    (grad,) = torch.autograd.grad(kl[:3].sum(), new[0])
    # each of the 3 copies has d/dnew_j = -mask_j / 2
    assert grad.tolist() == pytest.approx([-1.5, -1.5, 0.0])


def test_gspo_kl_of_no_samples_is_empty_and_mismatched_lists_are_refused():
    assert compute_gspo_kl([], [], []).shape == (0,)
    with pytest.raises(ValueError):
        compute_gspo_kl([t([-1.0]), t([-1.0])], [t([-1.0]), t([-1.0])], [t([1.0])])


def test_gspo_ratio_through_policy_loss():
    new = [t([-1.0, -2.0])]
    old = [t([-1.2, -2.4])]
    kl = compute_gspo_kl(new, old, [t([1.0, 1.0])])
    losses, _ = compute_policy_loss(kl, t([1.0, 1.0]), 0.2, 0.28)
    # sequence log-ratio mean(new - old) = 0.3 -> ratio e^0.3 = 1.3499 > 1.28: clipped, both tokens
    assert losses.tolist() == pytest.approx([-1.28, -1.28])


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_estimators(kind):
    lp, base = t([-1.0, -0.5]), t([-1.2, -0.1])
    d = [0.2, -0.4]  # lp - base
    expected = {
        "k1": d,
        "k2": [0.5 * x * x for x in d],
        "k3": [math.exp(-x) - 1 + x for x in d],
        "low_var_kl": [math.exp(-x) - 1 + x for x in d],
    }[kind]
    assert compute_approx_kl(lp, base, kind).tolist() == pytest.approx(expected, rel=1e-6)


def test_kl_is_float32_at_least():
    lp, base = t([-1.0]).to(torch.bfloat16), t([-1.5]).to(torch.bfloat16)
    assert compute_approx_kl(lp, base, "k1").dtype == torch.float32
    assert compute_approx_kl(t([-1.0]), base, "k1").dtype == torch.float64


def test_low_var_kl_is_clamped_and_k3_is_not():
    lp, base = t([-21.0]), t([-1.0])  # exp(20) - 1 - 20 is far above 10
    assert compute_approx_kl(lp, base, "low_var_kl").item() == 10.0
    assert compute_approx_kl(lp, base, "k3").item() == pytest.approx(math.exp(20) - 21, rel=1e-6)


def test_kl_with_importance_ratio_and_bad_type():
    lp, base = t([-1.0]), t([-1.5])
    assert compute_approx_kl(lp, base, "k1", importance_ratio=t([2.0])).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="kl_loss_type"):
        compute_approx_kl(lp, base, "k4")


def test_truncated_importance_sampling():
    args = SimpleNamespace(tis_clip=1.5, tis_clip_low=0.5)
    train = [t([-1.0, -2.0]), t([-0.5])]
    rollout = [t([-1.5, -1.0]), t([-0.5])]
    masks = [t([1.0, 1.0]), t([1.0])]
    loss, out_masks, metrics = vanilla_tis_function(
        args, pg_loss=t([2.0, 3.0, 4.0]), train_log_probs=train, rollout_log_probs=rollout, loss_masks=masks)
    # ratios e^0.5 = 1.6487 -> 1.5, e^-1 = 0.3679 -> 0.5, 1 -> 1
    assert loss.tolist() == pytest.approx([3.0, 1.5, 4.0])
    assert out_masks is masks
    assert metrics["tis"].tolist() == pytest.approx([math.exp(0.5), math.exp(-1.0), 1.0])
    assert metrics["tis_clipfrac"].tolist() == [1.0, 1.0, 0.0]
    assert metrics["tis_abs"].tolist() == pytest.approx([math.exp(0.5) - 1, 1 - math.exp(-1.0), 0.0])


# three samples: lengths 3, 2, 1; the last fully masked
LENGTHS = [3, 2, 1]
MASKS = [t([1.0, 1.0, 0.0]), t([1.0, 1.0]), t([0.0])]
X = t([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


@pytest.mark.parametrize("mode, total, normalizer", [
    # masked tokens 1+2+4+5 = 12; per-sample token counts clamped at 1: 2 + 2 + 1 = 5
    ("token-mean", 12.0, 5.0),
    # (1+2)/2 + (4+5)/2 + 0/1 = 6; three samples
    ("seq-mean-token-mean", 6.0, 3.0),
    # (3 + 9 + 0) / 4 (the constant length) = 3; three samples
    ("seq-mean-token-sum-norm", 3.0, 3.0),
])
def test_aggregations(mode, total, normalizer):
    reduce = sample_mean_reducer(LENGTHS, MASKS, mode, loss_agg_norm_len=4)
    assert reduce(X).item() == pytest.approx(total)
    assert batch_normalizer(MASKS, mode) == normalizer


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_does_not_depend_on_the_micro_batch_split(mode):
    whole = sample_mean_reducer(LENGTHS, MASKS, mode, 4)(X)
    first = sample_mean_reducer(LENGTHS[:1], MASKS[:1], mode, 4)(X[:3])
    rest = sample_mean_reducer(LENGTHS[1:], MASKS[1:], mode, 4)(X[3:])
    assert (first + rest).item() == pytest.approx(whole.item())


def test_single_sample_batches_and_single_token_samples():
    # one sample: the seq modes divide by 1; a one-token sample's mean is that token
    assert batch_normalizer([t([1.0])], "seq-mean-token-mean") == 1.0
    assert batch_normalizer([], "seq-mean-token-mean") == 1.0
    assert sample_mean_reducer([1], [t([1.0])], "seq-mean-token-mean")(t([5.0])).item() == 5.0
    # the constant length may be 1
    assert sample_mean_reducer([2], [t([1.0, 1.0])], "seq-mean-token-sum-norm", 1)(t([2.0, 3.0])).item() == 5.0


def test_empty_micro_batch_reduces_to_zero():
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert sample_mean_reducer([], [], mode, 4)(t([])).item() == 0.0


def test_reducer_errors_name_the_problem():
    with pytest.raises(ValueError, match="loss_agg_mode"):
        sample_mean_reducer(LENGTHS, MASKS, "seq-sum")
    with pytest.raises(ValueError, match="loss_agg_norm_len"):
        sample_mean_reducer(LENGTHS, MASKS, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="loss_agg_norm_len"):
        sample_mean_reducer(LENGTHS, MASKS, "seq-mean-token-sum-norm", 0)
    with pytest.raises(ValueError, match="response_lengths"):
        sample_mean_reducer([3, 2, 2], MASKS, "token-mean")
