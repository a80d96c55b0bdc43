"""One micro-batch's policy loss (pipeline.train.objective.policy_loss) on hand-built tensors: which
log-probs feed which term, in which order, with which sign, and what carries a gradient.
Expected values are worked out here with `math`, never by calling the code under test."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pipeline.train.losses import sample_mean_reducer
from pipeline.train.objective import LossHooks, MicroBatch, policy_loss

LN2 = math.log(2.0)


def args(**overrides):
    """The trainer's keys under slime's names (the YAML defaults of conf/trainer/policy_gradient.yaml)."""
    keys = dict(advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=None, eps_clip_c=None, use_tis=False,
                tis_clip=2.0, tis_clip_low=0.0, loss_agg_mode="seq-mean-token-mean", entropy_coef=0.0,
                use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="k1", use_unbiased_kl=False,
                use_rollout_logprobs=False, loss_agg_norm_len=None, use_opsm=False, opsm_delta=1e-4,
                get_mismatch_metrics=False)
    keys.update(overrides)
    return SimpleNamespace(**keys)


def tensors(*rows):
    return [torch.tensor(r, dtype=torch.float64) for r in rows]


def new_log_probs(*rows):
    return [torch.tensor(r, dtype=torch.float64, requires_grad=True) for r in rows]


def batch(advantages, old, ref=None, rollout=None, masks=None):
    lengths = [len(a) for a in advantages]
    return MicroBatch(response_lengths=lengths, total_lengths=[n + 3 for n in lengths],
                      loss_masks=masks if masks is not None else [torch.ones(n, dtype=torch.float64) for n in lengths],
                      advantages=tensors(*advantages), old_log_probs=tensors(*old),
                      ref_log_probs=tensors(*ref) if ref is not None else None,
                      rollout_log_probs=tensors(*rollout) if rollout is not None else None)


def total(x):
    return x.sum()


def zero_entropy(log_probs):
    return [torch.zeros_like(lp) for lp in log_probs]


def test_ppo_ratio_is_new_over_old_and_clip_high_defaults_to_eps_clip():
    # ratios new/old 2.0, 0.5, 1.0 (new log-probs ln2, -ln2, 0 against old 0); advantages 1, 1, -1
    log_probs = new_log_probs([LN2, -LN2], [0.0])
    b = batch([[1.0, 1.0], [-1.0]], old=[[0.0, 0.0], [0.0]])
    loss, metrics = policy_loss(args(eps_clip=0.2), b, log_probs, zero_entropy(log_probs), total, LossHooks())
    # 2.0 clips at 1 + eps_clip = 1.2 (-1.2); 0.5 with A > 0 keeps -0.5 (> -0.8); 1.0 with A < 0: 1.0
    assert loss.item() == pytest.approx(-1.2 - 0.5 + 1.0)
    assert metrics["pg_loss"].item() == pytest.approx(-0.7)
    assert metrics["pg_clipfrac"].item() == 1.0
    assert metrics["kl"].item() == pytest.approx(-LN2 + LN2 + 0.0)  # sum of old - new
    loss, metrics = policy_loss(args(eps_clip=0.2, eps_clip_high=0.5), b, log_probs, zero_entropy(log_probs), total,
                                LossHooks())
    assert metrics["pg_loss"].item() == pytest.approx(-1.5 - 0.5 + 1.0)  # 2.0 clips at 1.5 now


def test_ppo_kl_metric_is_old_minus_new():
    log_probs = new_log_probs([-LN2, -LN2])
    b = batch([[0.0, 0.0]], old=[[0.0, 0.0]])
    _, metrics = policy_loss(args(), b, log_probs, zero_entropy(log_probs), total, LossHooks())
    assert metrics["kl"].item() == pytest.approx(2 * LN2)


def test_dual_clip_bound_reaches_the_loss():
    log_probs = new_log_probs([math.log(4.0)])
    b = batch([[-1.0]], old=[[0.0]])
    _, plain = policy_loss(args(), b, log_probs, zero_entropy(log_probs), total, LossHooks())
    _, dual = policy_loss(args(eps_clip_c=3.0), b, log_probs, zero_entropy(log_probs), total, LossHooks())
    assert plain["pg_loss"].item() == pytest.approx(4.0)
    assert dual["pg_loss"].item() == pytest.approx(3.0)


def test_gspo_uses_each_sequence_mean_ratio():
    # sample 0: token ratios 2 and 1 -> sequence log-ratio mean ln2 / 2, ratio sqrt(2) on both tokens;
    # with eps_clip_high 0.5 nothing clips: pg = -(sqrt2 + sqrt2); token-level PPO would give -(1.5 + 1)
    log_probs = new_log_probs([LN2, 0.0])
    b = batch([[1.0, 1.0]], old=[[0.0, 0.0]])
    _, gspo = policy_loss(args(advantage_estimator="gspo", eps_clip_high=0.5), b, log_probs,
                          zero_entropy(log_probs), total, LossHooks())
    _, ppo = policy_loss(args(eps_clip_high=0.5), b, log_probs, zero_entropy(log_probs), total, LossHooks())
    assert gspo["pg_loss"].item() == pytest.approx(-2 * math.sqrt(2.0))
    assert ppo["pg_loss"].item() == pytest.approx(-2.5)
    assert gspo["kl"].item() == pytest.approx(2 * (-LN2 / 2))


def test_cispo_weighs_the_new_log_probs_by_the_clipped_ratio_without_its_gradient():
    # ratio 1.1 (inside the clip), A = 2: loss = -1.1 * 2 * log p, gradient -2.2 (no term through the ratio)
    lp = math.log(1.1)
    log_probs = new_log_probs([lp])
    b = batch([[2.0]], old=[[0.0]])
    loss, metrics = policy_loss(args(advantage_estimator="cispo", eps_clip_high=0.28), b, log_probs,
                                zero_entropy(log_probs), total, LossHooks())
    assert loss.item() == pytest.approx(-1.1 * 2.0 * lp)
    loss.backward()
    assert log_probs[0].grad.item() == pytest.approx(-2.2)
    # ratio 2.0 clips at 1 + eps_clip_high
    log_probs = new_log_probs([LN2])
    _, metrics = policy_loss(args(advantage_estimator="cispo", eps_clip=0.2, eps_clip_high=0.28), b, log_probs,
                             zero_entropy(log_probs), total, LossHooks())
    assert metrics["pg_loss"].item() == pytest.approx(-1.28 * 2.0 * LN2)
    assert metrics["pg_clipfrac"].item() == 1.0


def test_entropy_bonus_is_subtracted_and_reported():
    log_probs = new_log_probs([0.0, 0.0])
    b = batch([[1.0, -1.0]], old=[[0.0, 0.0]])
    entropy = tensors([0.5, 1.5])
    loss, metrics = policy_loss(args(entropy_coef=0.1), b, log_probs, entropy, total, LossHooks())
    assert metrics["entropy"].item() == pytest.approx(2.0)
    assert metrics["pg_loss"].item() == pytest.approx(0.0)
    assert loss.item() == pytest.approx(-0.1 * 2.0)


def test_kl_loss_to_the_reference_with_gradient():
    # k1 KL = new - ref: new ln2 vs ref 0 -> ln2; k2 would be ln2^2 / 2
    log_probs = new_log_probs([LN2])
    b = batch([[0.0]], old=[[LN2]], ref=[[0.0]])
    loss, metrics = policy_loss(args(use_kl_loss=True, kl_loss_coef=0.5), b, log_probs, zero_entropy(log_probs),
                                total, LossHooks())
    assert metrics["kl_loss"].item() == pytest.approx(LN2)
    assert loss.item() == pytest.approx(0.5 * LN2)
    loss.backward()
    assert log_probs[0].grad.item() == pytest.approx(0.5)  # d(0.5 * (new - ref)) / d new (A = 0: no pg term)
    log_probs = new_log_probs([LN2])
    _, metrics = policy_loss(args(use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k2"), b, log_probs,
                             zero_entropy(log_probs), total, LossHooks())
    assert metrics["kl_loss"].item() == pytest.approx(0.5 * LN2 ** 2)


def test_unbiased_kl_weighs_by_the_ratio_to_the_old_policy():
    # new ln2, old ln2 / 2: ratio sqrt(2); k1 KL to ref 0 is ln2, weighted: sqrt(2) ln2
    log_probs = new_log_probs([LN2])
    b = batch([[0.0]], old=[[LN2 / 2]], ref=[[0.0]])
    _, metrics = policy_loss(args(use_kl_loss=True, kl_loss_coef=1.0, use_unbiased_kl=True), b, log_probs,
                             zero_entropy(log_probs), total, LossHooks())
    assert metrics["kl_loss"].item() == pytest.approx(math.sqrt(2.0) * LN2)


def test_kl_loss_coef_zero_is_a_metric_only_and_a_non_finite_kl_cannot_reach_the_loss():
    # ref log-prob -inf: k3 = expm1(new - ref) - (new - ref) = inf
    log_probs = new_log_probs([0.0])
    b = batch([[1.0]], old=[[0.0]], ref=[[-math.inf]])
    loss, metrics = policy_loss(args(use_kl_loss=True, kl_loss_coef=0.0, kl_loss_type="k3"), b, log_probs,
                                zero_entropy(log_probs), total, LossHooks())
    assert math.isinf(metrics["kl_loss"].item())
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert log_probs[0].grad.item() == pytest.approx(-1.0)  # only the pg term: -A * d ratio / d new


def test_kl_loss_needs_reference_log_probs():
    log_probs = new_log_probs([0.0])
    with pytest.raises(ValueError, match=r"^use_kl_loss needs the reference model's log-probs$"):
        policy_loss(args(use_kl_loss=True, kl_loss_coef=0.1), batch([[1.0]], old=[[0.0]]), log_probs,
                    zero_entropy(log_probs), total, LossHooks())


def test_tis_weighs_the_pg_loss_by_the_clipped_old_over_rollout_ratio():
    # old - rollout: ln2 (ratio 2, under tis_clip 3) and 2 ln2 (ratio 4, clipped to 3); new = old: pg = -A
    log_probs = new_log_probs([0.0, 0.0])
    b = batch([[1.0, 1.0]], old=[[0.0, 0.0]], rollout=[[-LN2, -2 * LN2]])
    _, metrics = policy_loss(args(use_tis=True, tis_clip=3.0, tis_clip_low=0.5), b, log_probs,
                             zero_entropy(log_probs), total, LossHooks())
    assert metrics["pg_loss"].item() == pytest.approx(-(2.0 + 3.0))
    assert metrics["tis"].item() == pytest.approx(2.0 + 4.0)
    assert metrics["tis_clipfrac"].item() == pytest.approx(1.0)
    assert metrics["tis_abs"].item() == pytest.approx(1.0 + 3.0)
    message = r"^use_tis needs rollout_log_probs in the train data \(the engine's log-probs\)$"
    with pytest.raises(ValueError, match=message):
        policy_loss(args(use_tis=True), batch([[1.0]], old=[[0.0]]), log_probs[:1], zero_entropy(log_probs[:1]),
                    total, LossHooks())


def test_custom_tis_and_pg_loss_reducer_hooks_get_slimes_arguments():
    seen = {}

    def tis(a, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths):
        seen["tis"] = dict(train=[x.tolist() for x in train_log_probs], grad=[x.requires_grad for x in train_log_probs],
                           rollout=[x.tolist() for x in rollout_log_probs], masks=[m.tolist() for m in loss_masks],
                           total=total_lengths, response=response_lengths, args=a)
        return pg_loss * 3.0, [torch.zeros_like(m) for m in loss_masks], {"my_tis": torch.ones_like(pg_loss)}

    def reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
        seen["reducer"] = dict(total=total_lengths, response=response_lengths, masks=[m.tolist() for m in loss_masks],
                               per_token=calculate_per_token_loss)
        return lambda x: 10.0 * x.sum()

    log_probs = new_log_probs([LN2, 0.0], [0.0])
    b = batch([[1.0, 1.0], [1.0]], old=[[0.5, 0.0], [0.0]], rollout=[[0.25, 0.0], [0.0]])
    a = args(use_tis=True, eps_clip_high=10.0, loss_agg_mode="token-mean")
    entropy = tensors([1.0, 1.0], [1.0])
    _, metrics = policy_loss(a, b, log_probs, entropy, total, LossHooks(tis=tis, pg_loss_reducer=reducer))
    assert seen["tis"] == dict(train=[[0.5, 0.0], [0.0]], grad=[False, False], rollout=[[0.25, 0.0], [0.0]],
                               masks=[[1.0, 1.0], [1.0]], total=[5, 4], response=[2, 1], args=a)
    # the reducer gets the masks the TIS hook returned, and the per-token flag of token-mean
    assert seen["reducer"] == dict(total=[5, 4], response=[2, 1], masks=[[0.0, 0.0], [0.0]], per_token=True)
    # pg: ratios exp(ln2 - 0.5), 1, 1 with A = 1 -> -(e^(ln2 - 0.5) + 2), times 3 (TIS hook), times 10 (reducer)
    assert metrics["pg_loss"].item() == pytest.approx(-30.0 * (2.0 * math.exp(-0.5) + 2.0))
    assert metrics["my_tis"].item() == pytest.approx(3.0)  # hook metrics go through the plain reducer
    assert metrics["entropy"].item() == 0.0  # the hook rejected every token: later terms see none
    policy_loss(args(loss_agg_mode="seq-mean-token-mean"), b, log_probs, entropy, total,
                LossHooks(pg_loss_reducer=reducer))
    assert seen["reducer"]["per_token"] is False and seen["reducer"]["masks"] == [[1.0, 1.0], [1.0]]


@pytest.mark.parametrize("use_rollout_logprobs", [False, True])
def test_train_rollout_logprob_abs_diff_compares_the_trainers_log_probs(use_rollout_logprobs):
    # slime: the current log-probs when the old ones are the rollout's, else the old ones
    log_probs = new_log_probs([0.5, -0.5])
    b = batch([[0.0, 0.0]], old=[[0.25, 0.0]], rollout=[[0.1, -0.1]])
    _, metrics = policy_loss(args(use_rollout_logprobs=use_rollout_logprobs), b, log_probs,
                             zero_entropy(log_probs), total, LossHooks())
    # |0.5 - 0.1| + |-0.5 + 0.1| = 0.8 (current); |0.25 - 0.1| + |0 + 0.1| = 0.25 (old)
    assert metrics["train_rollout_logprob_abs_diff"].item() == pytest.approx(0.8 if use_rollout_logprobs else 0.25)
    b = batch([[0.0, 0.0]], old=[[0.25, 0.0]])
    _, metrics = policy_loss(args(), b, log_probs, zero_entropy(log_probs), total, LossHooks())
    assert "train_rollout_logprob_abs_diff" not in metrics


def test_the_loss_carries_the_gradient_and_the_metrics_do_not():
    # ratio 1, A = 1 and -2: d loss / d new = -A (inside the clip); entropy given with a gradient too
    log_probs = new_log_probs([0.0, 0.0])
    entropy = [torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)]
    b = batch([[1.0, -2.0]], old=[[0.0, 0.0]], ref=[[0.0, 0.0]], rollout=[[0.0, 0.0]])
    loss, metrics = policy_loss(args(use_kl_loss=True, kl_loss_coef=0.1, use_tis=True, entropy_coef=0.5), b,
                                log_probs, entropy, total, LossHooks())
    assert {name for name, m in metrics.items() if m.requires_grad} == set()
    assert set(metrics) == {"loss", "pg_loss", "pg_clipfrac", "kl", "entropy", "kl_loss", "tis", "tis_clipfrac",
                            "tis_abs", "ois", "train_rollout_logprob_abs_diff"}
    assert metrics["loss"].item() == pytest.approx(loss.item())
    loss.backward()
    assert log_probs[0].grad.tolist() == pytest.approx([-1.0 + 0.1, 2.0 + 0.1])
    assert entropy[0].grad.tolist() == pytest.approx([-0.5, -0.5])


# -- issue 31: masks a TIS hook returns, OPSM, mismatch metrics, the kl_loss_coef=0 departure --

def test_tokens_a_tis_hook_rejects_leave_every_later_term():
    # slime rebuilds its reducer with the masks the TIS hook returns (denominators stay the
    # original masks'): pg loss, entropy, KL and the metrics no longer see rejected tokens; the
    # hook's own metrics (and ois) are reduced with the original masks
    def reject_second_token(a, *, pg_loss, loss_masks, **_):
        masks = [m.clone() for m in loss_masks]
        masks[0][1] = 0.0
        return pg_loss, masks, {"kept": torch.cat(masks)}

    log_probs = new_log_probs([0.0, 0.0], [0.0])
    entropy = [torch.tensor([1.0, 3.0], dtype=torch.float64, requires_grad=True),
               torch.tensor([2.0], dtype=torch.float64, requires_grad=True)]
    b = batch([[1.0, 1.0], [1.0]], old=[[0.0, 0.0], [0.0]], ref=[[-1.0, -3.0], [0.0]], rollout=[[0.0, 0.0], [0.0]])
    reduce = sample_mean_reducer(b.response_lengths, b.loss_masks, "seq-mean-token-mean")
    a = args(use_tis=True, use_kl_loss=True, kl_loss_coef=0.5, entropy_coef=0.1)
    loss, metrics = policy_loss(a, b, log_probs, entropy, reduce, LossHooks(tis=reject_second_token))
    # ratio 1, A = 1: -1 per kept token; sample 0 keeps token 0 of its 2, sample 1 its one token
    assert metrics["pg_loss"].item() == pytest.approx(-1 / 2 - 1)
    assert metrics["entropy"].item() == pytest.approx(1 / 2 + 2)
    assert metrics["kl_loss"].item() == pytest.approx(1 / 2 + 0)  # k1: new - ref = 1 on token 0 (3 on token 1)
    assert metrics["kept"].item() == pytest.approx(1 / 2 + 1)
    assert metrics["ois"].item() == pytest.approx(1 + 1)
    loss.backward()
    assert log_probs[0].grad[1].item() == 0.0 and entropy[0].grad[1].item() == 0.0
    assert log_probs[0].grad[0].item() == pytest.approx(-1 / 2 + 0.5 / 2)  # pg -A/2, KL coef/2
    assert entropy[0].grad[0].item() == pytest.approx(-0.1 / 2)


def test_opsm_drops_negative_advantage_sequences_that_drifted_from_the_old_policy():
    # sequence KL (old - new, masked mean): sample 0: 0.5 with A < 0 (masked), sample 1: 0.5 with
    # A > 0 (kept), sample 2: 0.5 with A < 0 but delta 0.6 in the second call (kept)
    log_probs = new_log_probs([-0.5, -0.5], [-0.5], [-0.5])
    b = batch([[-1.0, -1.0], [1.0], [-1.0]], old=[[0.0, 0.0], [0.0], [0.0]])
    plain, _ = policy_loss(args(eps_clip=10.0), b, log_probs, zero_entropy(log_probs), total, LossHooks())
    loss, metrics = policy_loss(args(eps_clip=10.0, use_opsm=True, opsm_delta=0.1), b, log_probs,
                                zero_entropy(log_probs), total, LossHooks())
    r = math.exp(-0.5)  # ratio new/old
    assert plain.item() == pytest.approx(2 * r - r + r)
    assert loss.item() == pytest.approx(-r)  # only sample 1 is left
    assert metrics["opsm_clipfrac"].item() == pytest.approx(2.0 + 1.0)  # masked tokens, reduced (total: a sum)
    loss, metrics = policy_loss(args(eps_clip=10.0, use_opsm=True, opsm_delta=0.6), b, log_probs,
                                zero_entropy(log_probs), total, LossHooks())
    assert loss.item() == pytest.approx(plain.item()) and metrics["opsm_clipfrac"].item() == 0.0


def test_mismatch_metrics_alone_report_tis_and_ois_and_leave_the_loss_alone():
    # slime's guide: --get-mismatch-metrics "will only return mismatch metrics but not change the loss"
    log_probs = new_log_probs([0.0, 0.0])
    b = batch([[1.0, 1.0]], old=[[0.0, 0.0]], rollout=[[-LN2, -2 * LN2]])
    plain, plain_metrics = policy_loss(args(), b, log_probs, zero_entropy(log_probs), total, LossHooks())
    loss, metrics = policy_loss(args(get_mismatch_metrics=True, tis_clip=3.0), b, log_probs,
                                zero_entropy(log_probs), total, LossHooks())
    assert loss.item() == plain.item() == pytest.approx(-2.0)
    assert metrics["tis"].item() == pytest.approx(2.0 + 4.0)
    assert metrics["tis_clipfrac"].item() == pytest.approx(1.0)
    assert metrics["tis_abs"].item() == pytest.approx(1.0 + 3.0)
    assert metrics["ois"].item() == pytest.approx(2.0)  # new/old: 1 per token
    assert set(metrics) - set(plain_metrics) == {"tis", "tis_clipfrac", "tis_abs", "ois"}
    with pytest.raises(ValueError, match=r"^get_mismatch_metrics needs rollout_log_probs"):
        policy_loss(args(get_mismatch_metrics=True), batch([[1.0]], old=[[0.0]]), log_probs[:1],
                    zero_entropy(log_probs[:1]), total, LossHooks())


def test_the_kl_loss_coef_zero_departure_from_slime_is_documented():
    # slime adds 0 x KL (NaN when the KL overflows); ours leaves the term out: said so, not "as slime"
    import pipeline.train.objective as objective

    doc = objective.__doc__
    assert "kl_loss_coef" in doc and "NaN" in doc and "departs" in doc
    page = (Path(__file__).resolve().parents[2] / "docs" / "slime.md").read_text(encoding="utf-8")
    section = page.split("## Where the trainer departs from slime", 1)[1].split("\n## ", 1)[0]
    assert any("kl_loss_coef" in line and "NaN" in line for line in section.splitlines())


def test_ois_is_the_new_over_old_ratio_per_token():
    # new log-probs ln2 and -ln2 against old 0: ratios 2 and 0.5 (exp(-ppo_kl), ppo_kl = old - new)
    log_probs = new_log_probs([LN2, -LN2])
    b = batch([[1.0, 1.0]], old=[[0.0, 0.0]], rollout=[[0.0, 0.0]])
    _, metrics = policy_loss(args(get_mismatch_metrics=True), b, log_probs, zero_entropy(log_probs), total,
                             LossHooks())
    assert metrics["ois"].item() == pytest.approx(2.0 + 0.5)
    log_probs = new_log_probs([LN2])
    _, metrics = policy_loss(args(use_tis=True), batch([[1.0]], old=[[0.0]], rollout=[[0.0]]), log_probs,
                             zero_entropy(log_probs), total, LossHooks())
    assert metrics["ois"].item() == pytest.approx(2.0)


@pytest.mark.parametrize("use_rollout_logprobs", [False, True])
def test_the_tis_hook_gets_the_current_log_probs_when_the_old_ones_are_the_rollouts(use_rollout_logprobs):
    seen = {}

    def tis(a, *, pg_loss, train_log_probs, loss_masks, **_):
        seen["train"] = [x.tolist() for x in train_log_probs]
        seen["grad"] = [x.requires_grad for x in train_log_probs]
        return pg_loss, loss_masks, {}

    log_probs = new_log_probs([0.5, -0.5])
    b = batch([[1.0, 1.0]], old=[[0.25, 0.0]], rollout=[[0.1, -0.1]])
    policy_loss(args(use_tis=True, use_rollout_logprobs=use_rollout_logprobs), b, log_probs,
                zero_entropy(log_probs), total, LossHooks(tis=tis))
    assert seen["train"] == ([[0.5, -0.5]] if use_rollout_logprobs else [[0.25, 0.0]])
    assert seen["grad"] == [False]  # detached either way


def test_tokens_a_tis_hook_rejects_keep_the_constant_length_of_seq_mean_token_sum_norm():
    # the reducer rebuilt on the hook's masks keeps loss_agg_norm_len (Dr. GRPO's constant length)
    def reject_second_token(a, *, pg_loss, loss_masks, **_):
        masks = [m.clone() for m in loss_masks]
        masks[0][1] = 0.0
        return pg_loss, masks, {}

    log_probs = new_log_probs([0.0, 0.0], [0.0])
    entropy = tensors([1.0, 3.0], [2.0])
    b = batch([[1.0, 1.0], [1.0]], old=[[0.0, 0.0], [0.0]], rollout=[[0.0, 0.0], [0.0]])
    reduce = sample_mean_reducer(b.response_lengths, b.loss_masks, "seq-mean-token-sum-norm", 4)
    a = args(use_tis=True, loss_agg_mode="seq-mean-token-sum-norm", loss_agg_norm_len=4)
    _, metrics = policy_loss(a, b, log_probs, entropy, reduce, LossHooks(tis=reject_second_token))
    # ratio 1, A = 1: -1 on each of the 2 kept tokens, over the constant length 4
    assert metrics["pg_loss"].item() == pytest.approx(-2 / 4)
    assert metrics["entropy"].item() == pytest.approx((1.0 + 2.0) / 4)


def test_kl_loss_coef_zero_adds_nothing_to_the_autograd_graph():
    # the KL as a metric only is computed on detached log-probs: no tensor is saved for a
    # backward it never takes (the same graph as without use_kl_loss)
    def saved_tensors(**overrides):
        count = 0

        def pack(t):
            nonlocal count
            count += 1
            return t

        log_probs = new_log_probs([0.0, -0.5])
        b = batch([[1.0, -1.0]], old=[[0.0, 0.0]], ref=[[-1.0, 0.5]])
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            policy_loss(args(kl_loss_type="k3", use_unbiased_kl=True, **overrides), b, log_probs,
                        zero_entropy(log_probs), total, LossHooks())
        return count

    plain = saved_tensors()
    assert saved_tensors(use_kl_loss=True, kl_loss_coef=0.0) == plain
    assert saved_tensors(use_kl_loss=True, kl_loss_coef=0.1) > plain  # the count sees the KL's graph
