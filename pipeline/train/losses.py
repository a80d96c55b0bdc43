"""Policy-gradient loss numerics, equal to slime's `slime/utils/ppo_utils.py` and its loss reducers.

Tensors are slime's layout: per-token values of a micro-batch's responses concatenated into one
flat tensor (sample i contributes `response_lengths[i]` entries), per-sample values as lists.

- `compute_policy_loss`: PPO-clip with asymmetric bounds `[1 - eps_clip, 1 + eps_clip_high]`
  (clip-higher) and optional dual clip `eps_clip_c` (> 1) capping the loss of negative-advantage
  tokens at `eps_clip_c * |A|`. `ppo_kl = old_log_probs - log_probs`, so ratio = exp(-ppo_kl).
- `compute_gspo_kl`: GSPO's sequence-level ratio: each sample's masked mean of `old - new`,
  repeated over its tokens (the gradient flows through the mean to every token).
- `compute_cispo_loss`: CISPO, `-sg(clamp(ratio)) * A * log_probs`.
- `compute_approx_kl`: KL to a reference, estimators k1, k2, k3 (= low_var_kl, which is also
  clamped to [-10, 10]), optionally importance-weighted (`use_unbiased_kl`).
- `vanilla_tis_function`: truncated importance sampling between the trainer's (old) log-probs and
  the rollout engine's: the pg loss times `clamp(exp(train - rollout), tis_clip_low, tis_clip)`;
  the signature is slime's `--custom-tis-function-path` one. `icepop_function` (slime's
  `icepop_function`, chosen by that path): the weight is the ratio itself inside
  `[tis_clip_low, tis_clip]`, 0 outside (those tokens drop out).
- `compute_opsm_mask`: off-policy sequence masking (slime's `--use-opsm`): 0 on every token of a
  sample whose masked mean of `old - new` exceeds `opsm_delta`, where the advantage is negative.
- `sample_mean_reducer` / `batch_normalizer`: the aggregation (`loss_agg_mode`). A reducer maps a
  flat per-token tensor of one micro-batch to a sum; dividing the sum over micro-batches by the
  global batch's normalizer gives the loss, whatever the micro-batch split:

  | mode                    | per-sample term                | normalizer                      |
  |-------------------------|--------------------------------|---------------------------------|
  | token-mean              | sum_t m x                      | sum_i max(sum_t m_i, 1)         |
  | seq-mean-token-mean     | sum_t m x / max(D_i, 1)        | number of rollouts              |
  | seq-mean-token-sum-norm | sum_t m x / loss_agg_norm_len  | number of rollouts (Dr. GRPO)   |

  D_i (`sample_denoms`, slime's `rollout_mask_sums`) is the masked-token count of every sample of
  sample i's rollout in its step (its own count when each sample is its own rollout), and the
  seq modes count each rollout once (`counted`: 1 on one sample of each rollout): a trajectory
  split into several samples sharing a `rollout_id` is one token-weighted mean, as in slime.
  The weights are built in the input's precision (float32 at least: an integer metric is not
  truncated, a float64 one keeps float64).

  token-mean is slime's `--calculate-per-token-loss`, seq-mean-token-mean slime's default
  (`sum_of_sample_mean` scaled by 1 / global_batch_size), seq-mean-token-sum-norm Dr. GRPO's
  constant-length normalisation (verl's name; slime gets it through a custom pg-loss reducer).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from pipeline.train.choices import KL_LOSS_TYPES, LOSS_AGG_MODES

__all__ = [
    "KL_LOSS_TYPES",
    "LOSS_AGG_MODES",
    "batch_normalizer",
    "normalizer_part",
    "compute_approx_kl",
    "compute_cispo_loss",
    "compute_gspo_kl",
    "compute_opsm_mask",
    "compute_policy_loss",
    "icepop_function",
    "sample_mean_reducer",
    "vanilla_tis_function",
]


Reducer = Callable[[torch.Tensor], torch.Tensor]


def compute_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip losses and the clipped indicator (1.0 where the clipped term won)."""
    ratio = torch.exp(-ppo_kl)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    losses = torch.maximum(unclipped, clipped)
    clipfrac = (clipped > unclipped).float()
    if eps_clip_c is not None:
        if eps_clip_c <= 1.0:
            raise ValueError(f"eps_clip_c (dual-clip bound) must be > 1.0, got {eps_clip_c}")
        capped = torch.minimum(losses, -advantages * eps_clip_c)
        losses = torch.where(advantages < 0, capped, losses)
    return losses, clipfrac


def compute_cispo_loss(
    ppo_kl: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1): the clamped ratio, without gradient, weighs `-A * log_probs`."""
    ratio = torch.exp(-ppo_kl)
    weight = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    losses = -weight.detach() * advantages * log_probs
    return losses, (weight != ratio).float()


def compute_gspo_kl(
    log_probs: list[torch.Tensor],
    old_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
) -> torch.Tensor:
    """Per sample the masked mean of `old - new` (its sequence-level log-ratio, negated), repeated
    over the sample's tokens; concatenated."""
    pieces = []
    for new, old, mask in zip(log_probs, old_log_probs, loss_masks, strict=True):
        mean = ((old - new) * mask).sum() / mask.sum().clamp_min(1)
        pieces.append(mean.expand(new.shape[0]))
    if not pieces:
        return torch.zeros(0)
    return torch.cat(pieces)


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_loss_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL(new || base) estimate (Schulman's k1, k2, k3), in float32 at least."""
    dtype = torch.promote_types(torch.promote_types(log_probs.dtype, log_probs_base.dtype), torch.float32)
    log_ratio = log_probs.to(dtype) - log_probs_base.to(dtype)
    if kl_loss_type == "k1":
        kl = log_ratio
    elif kl_loss_type == "k2":
        kl = 0.5 * log_ratio.square()
    elif kl_loss_type in ("k3", "low_var_kl"):
        kl = torch.expm1(-log_ratio) + log_ratio
    else:
        raise ValueError(f"kl_loss_type must be one of {list(KL_LOSS_TYPES)}, got {kl_loss_type!r}")
    if importance_ratio is not None:
        kl = importance_ratio * kl
    if kl_loss_type == "low_var_kl":
        kl = kl.clamp(-10.0, 10.0)
    return kl


def vanilla_tis_function(
    args: Any,
    *,
    pg_loss: torch.Tensor,
    train_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    **kwargs: Any,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """Truncated importance sampling: `pg_loss * clamp(exp(train - rollout), args.tis_clip_low,
    args.tis_clip)`; returns (pg_loss, loss_masks unchanged, per-token metrics tis, tis_clipfrac,
    tis_abs)."""
    ratio = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
    weights = ratio.clamp(args.tis_clip_low, args.tis_clip)
    return pg_loss * weights, loss_masks, _tis_metrics(ratio, weights)


def _tis_metrics(ratio: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token TIS metrics: the ratio, where the weight differs from it, and |ratio - 1|."""
    return {
        "tis": ratio.detach(),
        "tis_clipfrac": (weights != ratio).float().detach(),
        "tis_abs": (ratio - 1.0).abs().detach(),
    }


def icepop_function(
    args: Any,
    *,
    pg_loss: torch.Tensor,
    train_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    **kwargs: Any,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """IcePop: `pg_loss * r` where `r = exp(train - rollout)` lies in `[args.tis_clip_low,
    args.tis_clip]`, 0 elsewhere; loss_masks unchanged, metrics as `vanilla_tis_function`'s."""
    ratio = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
    inside = (ratio >= args.tis_clip_low) & (ratio <= args.tis_clip)
    weights = torch.where(inside, ratio, torch.zeros_like(ratio))
    return pg_loss * weights, loss_masks, _tis_metrics(ratio, weights)


def compute_opsm_mask(
    args: Any,
    full_log_probs: list[torch.Tensor],
    full_old_log_probs: list[torch.Tensor],
    advantages: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token keep mask, concatenated; slime's count of masked sequences: per sample its
    masked tokens over its loss-mask tokens, summed). A token is dropped where its advantage
    is negative and its sample's masked mean of `old - new` exceeds `args.opsm_delta`."""
    keep, fractions = [], []
    for new, old, advantage, mask in zip(full_log_probs, full_old_log_probs, advantages, loss_masks, strict=True):
        tokens = mask.sum().clamp_min(1)
        drifted = ((old - new).detach() * mask).sum() / tokens > args.opsm_delta
        dropped = ((advantage < 0) & drifted).to(new.dtype)
        fractions.append(dropped.sum() / tokens)
        keep.append(1.0 - dropped)
    if not keep:
        return torch.zeros(0), torch.zeros(())
    return torch.cat(keep), torch.stack(fractions).sum()


def sample_mean_reducer(
    response_lengths: list[int],
    loss_masks: list[torch.Tensor],
    loss_agg_mode: str,
    loss_agg_norm_len: int | None = None,
    sample_denoms: list[float] | None = None,
) -> Reducer:
    """`x -> sum_i term_i(x)` over one micro-batch's flat per-token tensor (table in the module
    docstring); `loss_agg_norm_len` is the constant length of seq-mean-token-sum-norm,
    `sample_denoms` the per-sample denominators D_i of seq-mean-token-mean (None: each sample's
    own masked-token count). The sum is in x's precision, float32 at least."""
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {list(LOSS_AGG_MODES)}, got {loss_agg_mode!r}")
    lengths = [int(m.shape[0]) for m in loss_masks]
    if lengths != [int(n) for n in response_lengths]:
        raise ValueError(f"loss_masks lengths {lengths} differ from response_lengths {list(response_lengths)}")
    if sample_denoms is not None and len(sample_denoms) != len(loss_masks):
        raise ValueError(f"sample_denoms has {len(sample_denoms)} entries for {len(loss_masks)} samples")
    if loss_agg_mode == "seq-mean-token-sum-norm" and loss_masks and (
            loss_agg_norm_len is None or loss_agg_norm_len <= 0):
        raise ValueError(f"seq-mean-token-sum-norm needs a positive loss_agg_norm_len, got {loss_agg_norm_len}")
    if not loss_masks:
        return lambda x: x.sum() * 0.0
    cache: dict[torch.dtype, torch.Tensor] = {}

    def weights(dtype: torch.dtype) -> torch.Tensor:
        if dtype not in cache:
            masks = [m.to(dtype) for m in loss_masks]
            if loss_agg_mode == "token-mean":
                cache[dtype] = torch.cat(masks)
            elif loss_agg_mode == "seq-mean-token-mean":
                denoms = ([m.sum() for m in masks] if sample_denoms is None
                          else [m.new_tensor(float(d)) for d, m in zip(sample_denoms, masks)])
                cache[dtype] = torch.cat([m / d.clamp_min(1.0) for m, d in zip(masks, denoms)])
            else:
                cache[dtype] = torch.cat(masks) / float(loss_agg_norm_len)  # type: ignore[arg-type]
        return cache[dtype]

    def reduce(x: torch.Tensor) -> torch.Tensor:
        # (an integer or bool x is promoted to the weights' float32 by the product)
        return (x * weights(torch.promote_types(x.dtype, torch.float32))).sum()

    return reduce


def normalizer_part(loss_masks: list[torch.Tensor], loss_agg_mode: str, counted: list[int] | None = None) -> float:
    """These samples' part of the batch normalizer: additive, so a batch split over workers sums
    its parts (0 for no samples). token-mean: masked tokens per sample (at least 1); the seq
    modes: rollouts, `counted` marking one sample of each (None: every sample its own)."""
    if loss_agg_mode == "token-mean":
        return float(sum(max(float(m.sum()), 1.0) for m in loss_masks))
    return float(len(loss_masks) if counted is None else sum(int(c) for c in counted))


def batch_normalizer(loss_masks: list[torch.Tensor], loss_agg_mode: str, counted: list[int] | None = None) -> float:
    """The global batch's divisor for the summed reducer outputs (module docstring)."""
    return max(normalizer_part(loss_masks, loss_agg_mode, counted), 1.0)
