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


# -- issue 31: the reducer's dtype, per-rollout denominators, OPSM, icepop --

def test_an_integer_metric_is_weighed_as_a_number_not_truncated():
    # a hook's count-like metric may be an integer tensor (slime's mis.py fractions): 3 on every
    # token of sample 0, 4 on sample 1; masks float32 as the trainer holds them
    lengths, masks = [3, 2], [torch.ones(3), torch.ones(2)]
    counts = torch.tensor([3, 3, 3, 4, 4])
    assert sample_mean_reducer(lengths, masks, "seq-mean-token-mean")(counts).item() == pytest.approx(3.0 + 4.0)
    assert sample_mean_reducer(lengths, masks, "token-mean")(counts).item() == pytest.approx(17.0)
    assert sample_mean_reducer(lengths, masks, "seq-mean-token-sum-norm", 4)(counts).item() == pytest.approx(17 / 4)
    flags = torch.tensor([True, False, True, True, False])
    assert sample_mean_reducer(lengths, masks, "seq-mean-token-mean")(flags).item() == pytest.approx(2 / 3 + 1 / 2)


def test_a_float64_input_is_reduced_in_float64():
    # float32 masks (the trainer's) and float64 values: the weights 1/3 and 1/7 must not be float32's
    lengths, masks = [3, 7], [torch.ones(3), torch.ones(7)]
    values = [0.1 * k for k in range(1, 11)]
    expected = math.fsum(values[:3]) / 3 + math.fsum(values[3:]) / 7
    out = sample_mean_reducer(lengths, masks, "seq-mean-token-mean")(t(values))
    assert out.dtype == torch.float64
    assert out.item() == pytest.approx(expected, rel=1e-15)
    out = sample_mean_reducer(lengths, masks, "seq-mean-token-sum-norm", 3)(t(values))
    assert out.item() == pytest.approx(math.fsum(values) / 3, rel=1e-15)


def test_sample_denominators_average_a_rollout_over_all_its_tokens():
    # rollout 0 is two samples (2 and 3 masked tokens: denominator 5 for both), rollout 1 one sample
    lengths, masks = [2, 3, 1], [t([1.0, 1.0]), t([1.0, 1.0, 1.0]), t([1.0])]
    x = t([1.0, 1.0, 2.0, 2.0, 2.0, 5.0])
    reduce = sample_mean_reducer(lengths, masks, "seq-mean-token-mean", sample_denoms=[5, 5, 1])
    assert reduce(x).item() == pytest.approx((2.0 + 6.0) / 5 + 5.0)
    # token-mean and Dr. GRPO's constant length do not read the denominators (slime's per-token sum)
    assert sample_mean_reducer(lengths, masks, "token-mean", sample_denoms=[5, 5, 1])(x).item() == pytest.approx(13.0)
    # a denominator of 0 (a fully masked rollout) is clamped at 1, as slime's
    zero = sample_mean_reducer([2], [t([0.0, 0.0])], "seq-mean-token-mean", sample_denoms=[0])(t([3.0, 4.0]))
    assert zero.item() == 0.0
    with pytest.raises(ValueError, match="sample_denoms"):
        sample_mean_reducer(lengths, masks, "seq-mean-token-mean", sample_denoms=[5, 5])
    # fractional masks give fractional denominators: taken in the input's float64, not float32
    fractional = sample_mean_reducer([1], [t([0.1])], "seq-mean-token-mean", sample_denoms=[2.2])(t([1.0]))
    assert fractional.item() == pytest.approx(0.1 / 2.2, rel=1e-15)


def test_the_normalizer_counts_each_rollout_once():
    from pipeline.train.losses import normalizer_part

    masks = [t([1.0, 1.0]), t([1.0, 0.0, 1.0]), t([0.0])]
    # samples 0 and 1 are one rollout: the seq modes count 2 rollouts; token-mean counts tokens
    for mode in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert normalizer_part(masks, mode, counted=[1, 0, 1]) == 2.0
        assert batch_normalizer(masks, mode, counted=[1, 0, 1]) == 2.0
        assert normalizer_part(masks, mode) == 3.0
    assert normalizer_part(masks, "token-mean", counted=[1, 0, 1]) == 2.0 + 2.0 + 1.0


def test_icepop_zeroes_the_tokens_whose_ratio_leaves_the_band():
    from pipeline.train.losses import icepop_function

    args = SimpleNamespace(tis_clip=1.5, tis_clip_low=0.5)
    train = [t([-1.0, -2.0]), t([-0.5])]
    rollout = [t([-1.5, -1.0]), t([-0.5])]
    masks = [t([1.0, 1.0]), t([1.0])]
    loss, out_masks, metrics = icepop_function(
        args, pg_loss=t([2.0, 3.0, 4.0]), train_log_probs=train, rollout_log_probs=rollout, loss_masks=masks)
    # ratios e^0.5 = 1.65 (above 1.5: 0), e^-1 = 0.37 (below 0.5: 0), 1 (kept, weight 1)
    assert loss.tolist() == pytest.approx([0.0, 0.0, 4.0])
    assert out_masks is masks
    assert metrics["tis"].tolist() == pytest.approx([math.exp(0.5), math.exp(-1.0), 1.0])
    assert metrics["tis_clipfrac"].tolist() == [1.0, 1.0, 0.0]
    assert metrics["tis_abs"].tolist() == pytest.approx([math.exp(0.5) - 1, 1 - math.exp(-1.0), 0.0])
    # the band's edges are inside it
    edge = icepop_function(args, pg_loss=t([1.0, 1.0]), train_log_probs=[t([math.log(1.5), math.log(0.5)])],
                           rollout_log_probs=[t([0.0, 0.0])], loss_masks=[t([1.0, 1.0])])[0]
    assert edge.tolist() == pytest.approx([1.5, 0.5])


def test_opsm_masks_negative_advantage_sequences_that_drifted_past_delta():
    from pipeline.train.losses import compute_opsm_mask

    args = SimpleNamespace(opsm_delta=0.1)
    # sequence KL = masked mean of old - new: 0.2 (over the 2 masked tokens), 0.2, 0.05
    new = [t([-1.0, -1.0, -9.0]), t([-1.0]), t([-1.0, -1.0])]
    old = [t([-0.8, -0.8, 5.0]), t([-0.8]), t([-0.95, -0.95])]
    advantages = [t([-1.0, -1.0, -1.0]), t([1.0]), t([-1.0, -1.0])]
    masks = [t([1.0, 1.0, 0.0]), t([1.0]), t([1.0, 1.0])]
    mask, clipfrac = compute_opsm_mask(args, full_log_probs=new, full_old_log_probs=old, advantages=advantages,
                                       loss_masks=masks)
    # sample 0: A < 0 and 0.2 > 0.1: masked; sample 1: A > 0: kept; sample 2: 0.05 <= 0.1: kept
    assert mask.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    # slime's count: per sample, the masked tokens over its loss-mask tokens (3 / 2 here), summed
    assert clipfrac.item() == pytest.approx(1.5)


def test_opsm_edges_strict_threshold_negative_advantages_only_masked_tokens_and_lengths():
    from pipeline.train.losses import compute_opsm_mask

    args = SimpleNamespace(opsm_delta=0.5)

    def mask_of(new, old, advantages, masks):
        return compute_opsm_mask(args, full_log_probs=new, full_old_log_probs=old, advantages=advantages,
                                 loss_masks=masks)

    # a sequence KL equal to delta is not above it; advantages 0 and 0.5 are not negative
    keep, count = mask_of([t([0.0])] * 3, [t([0.5]), t([1.0]), t([1.0])], [t([-1.0]), t([0.0]), t([0.5])],
                          [t([1.0])] * 3)
    assert keep.tolist() == [1.0, 1.0, 1.0] and count.item() == 0.0
    # one masked token of a one-token sample: 1 dropped token over 1, not clamped to 2
    keep, count = mask_of([t([0.0])], [t([1.0])], [t([-1.0])], [t([1.0])])
    assert keep.tolist() == [0.0] and count.item() == 1.0
    # a token outside the loss mask does not count towards the drift (here it would pull it below delta)
    keep, _ = mask_of([t([0.0, 0.0])], [t([1.0, -9.0])], [t([-1.0, -1.0])], [t([1.0, 0.0])])
    assert keep.tolist() == [0.0, 0.0]
    keep, count = mask_of([], [], [], [])
    assert keep.shape == (0,) and count.item() == 0.0
    with pytest.raises(ValueError):
        mask_of([t([0.0])], [t([0.0])], [], [t([1.0])])
