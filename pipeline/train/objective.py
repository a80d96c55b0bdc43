"""One micro-batch's policy loss and metrics, in the order slime's `policy_loss_function` uses.

ppo_kl (old - new; GSPO: per-sequence mean) -> pg loss (PPO-clip / CISPO) -> optional OPSM mask
(`use_opsm`) -> optional TIS weights (default or custom `fn(args, *, pg_loss, train_log_probs,
rollout_log_probs, loss_masks, ...)`) -> reduce pg loss (default or custom pg-loss reducer) ->
minus entropy_coef * entropy -> plus kl_loss_coef * KL to the reference. Every returned value is
a reducer sum; the trainer divides by the global batch's normalizer (`losses.batch_normalizer`),
so the sum over micro-batches is the batch's mean.

Masks a TIS hook returns (rejection sampling) replace the loss masks for the pg loss and every
later term and metric, as slime rebuilds its reducer: the reducer is rebuilt on them with the
original denominators (the batch's `rollout_mask_sums`, else the original masks' counts); the
hook's own metrics and `ois` keep the original masks.

Where this departs from slime (docs/slime.md, "Where the trainer departs from slime"):
- `kl_loss_coef` 0: the KL is a metric only, computed without gradient and left out of the loss;
  slime adds 0 x KL, which is NaN when the KL overflows (inf), so a run's loss turns NaN.
- `get_mismatch_metrics` without `use_tis` reports the TIS function's metrics and `ois` and
  leaves the loss alone, as slime's guide says; slime's code applies that function's weights
  and masks too. It needs no custom TIS function (the built-in one's metrics; slime asks for one).
- `opsm_clipfrac` is reduced like every metric (the share of masked tokens under
  `loss_agg_mode`); slime sums the per-sample shares and divides by the sample count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from pipeline.train.losses import (
    compute_approx_kl,
    compute_cispo_loss,
    compute_gspo_kl,
    compute_opsm_mask,
    compute_policy_loss,
    sample_mean_reducer,
    vanilla_tis_function,
)

__all__ = ["MicroBatch", "LossHooks", "policy_loss"]


@dataclass
class MicroBatch:
    """Per-sample tensors of one micro-batch (slime's batch keys, lists of 1-D tensors)."""

    response_lengths: list[int]
    total_lengths: list[int]
    loss_masks: list[torch.Tensor]
    advantages: list[torch.Tensor]
    old_log_probs: list[torch.Tensor]
    ref_log_probs: list[torch.Tensor] | None
    rollout_log_probs: list[torch.Tensor] | None
    # per sample the masked tokens of its rollout in its step (slime's key; None: its own)
    rollout_mask_sums: list[float] | None = None


@dataclass
class LossHooks:
    """slime's trainer-side hooks (None: the built-in behaviour)."""

    tis: Callable[..., Any] | None = None
    pg_loss_reducer: Callable[..., Any] | None = None


def policy_loss(args: Any, batch: MicroBatch, log_probs: list[torch.Tensor], entropy: list[torch.Tensor],
                reduce: Callable[[torch.Tensor], torch.Tensor], hooks: LossHooks,
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, metrics) of one micro-batch as reducer sums (module docstring); `args` carries the
    trainer's keys under slime's names."""
    estimator = args.advantage_estimator
    advantages = torch.cat(batch.advantages)
    if estimator == "gspo":
        ppo_kl = compute_gspo_kl(log_probs, batch.old_log_probs, batch.loss_masks)
    else:
        ppo_kl = torch.cat(batch.old_log_probs) - torch.cat(log_probs)
    flat_log_probs = torch.cat(log_probs)
    eps_clip_high = args.eps_clip if args.eps_clip_high is None else args.eps_clip_high
    if estimator == "cispo":
        pg_loss, clipfrac = compute_cispo_loss(ppo_kl, flat_log_probs, advantages, args.eps_clip, eps_clip_high)
    else:
        pg_loss, clipfrac = compute_policy_loss(ppo_kl, advantages, args.eps_clip, eps_clip_high,
                                                eps_clip_c=args.eps_clip_c)

    metrics: dict[str, torch.Tensor] = {}
    if args.use_opsm:
        keep, _ = compute_opsm_mask(args, log_probs, batch.old_log_probs, batch.advantages, batch.loss_masks)
        pg_loss = pg_loss * keep
        metrics["opsm_clipfrac"] = reduce(1.0 - keep)
    masks = batch.loss_masks
    if args.use_tis or args.get_mismatch_metrics:
        if batch.rollout_log_probs is None:
            key = "use_tis" if args.use_tis else "get_mismatch_metrics"
            raise ValueError(f"{key} needs rollout_log_probs in the train data (the engine's log-probs)")
        # the trainer's log-probs: the old ones (the current ones when the old are the rollout's)
        train_log_probs = log_probs if args.use_rollout_logprobs else batch.old_log_probs
        tis_fn = hooks.tis or vanilla_tis_function
        weighted, tis_masks, tis_metrics = tis_fn(
            args, pg_loss=pg_loss, train_log_probs=[lp.detach() for lp in train_log_probs],
            rollout_log_probs=batch.rollout_log_probs, loss_masks=batch.loss_masks,
            total_lengths=batch.total_lengths, response_lengths=batch.response_lengths)
        metrics.update({k: reduce(v.detach()) for k, v in tis_metrics.items()})
        metrics["ois"] = reduce(torch.exp(-ppo_kl).detach())
        if args.use_tis:
            pg_loss, masks = weighted, tis_masks
        if masks is not batch.loss_masks:  # rejected tokens leave every later term
            denoms = batch.rollout_mask_sums or [float(m.sum()) for m in batch.loss_masks]
            reduce = sample_mean_reducer(batch.response_lengths, masks, args.loss_agg_mode, args.loss_agg_norm_len,
                                         sample_denoms=denoms)

    if hooks.pg_loss_reducer is not None:
        pg_reduce = hooks.pg_loss_reducer(batch.total_lengths, batch.response_lengths, masks,
                                          args.loss_agg_mode == "token-mean")
    else:
        pg_reduce = reduce
    pg_loss_sum = pg_reduce(pg_loss)
    entropy_sum = reduce(torch.cat(entropy))
    loss = pg_loss_sum - args.entropy_coef * entropy_sum

    if args.use_kl_loss:
        if batch.ref_log_probs is None:
            raise ValueError("use_kl_loss needs the reference model's log-probs")
        # kl_loss_coef 0: the KL is a metric only, computed without gradient and left out of the
        # loss, so a non-finite KL cannot reach it (a departure: slime adds 0 x KL, module docstring)
        with_grad = float(args.kl_loss_coef) != 0.0
        current = flat_log_probs if with_grad else flat_log_probs.detach()
        ratio = torch.exp(current - torch.cat(batch.old_log_probs)) if args.use_unbiased_kl else None
        kl_sum = reduce(compute_approx_kl(current, torch.cat(batch.ref_log_probs), args.kl_loss_type, ratio))
        if with_grad:
            loss = loss + args.kl_loss_coef * kl_sum
        metrics["kl_loss"] = kl_sum.detach()

    metrics.update({
        "loss": loss.detach(),
        "pg_loss": pg_loss_sum.detach(),
        "pg_clipfrac": reduce(clipfrac),
        "kl": reduce(ppo_kl.detach()),
        "entropy": entropy_sum.detach(),
    })
    if batch.rollout_log_probs is not None:
        # the trainer's log-probs of the sampled tokens vs the engine's (slime: the current ones
        # when the old ones are the rollout's)
        trainer_lp = flat_log_probs if args.use_rollout_logprobs else torch.cat(batch.old_log_probs)
        diff = (trainer_lp.detach() - torch.cat(batch.rollout_log_probs)).abs()
        metrics["train_rollout_logprob_abs_diff"] = reduce(diff)
    return loss, metrics
