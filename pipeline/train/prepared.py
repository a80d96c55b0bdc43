"""A rollout's samples prepared for the updates, and the micro-batches the trainer cuts from them.

`Prepared` holds what `PolicyGradientTrainer.prepare` fixes before any update (old and reference
log-probs, advantages); `advantages` gives slime's GRPO-family advantages (each sample's reward on
every response token) or a custom `fn(args, rollout_data) -> None`'s; `micro_batch` picks a
micro-batch's tensors; `empty_micro_batch` is what a worker runs when its share of a step ran out
before a peer's; `custom_loss` calls slime's `custom_loss(args, batch, logits, sum_of_sample_mean)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from pipeline.train import batches
from pipeline.train.objective import MicroBatch

__all__ = ["Prepared", "advantages", "custom_loss", "empty_micro_batch", "empty_tokens", "micro_batch"]


@dataclass
class Prepared:
    """A rollout's samples with everything fixed before the updates."""

    samples: batches.TrainSamples
    advantages: list[torch.Tensor]
    # None: the sample is trained before any update; its old log-probs are the training
    # forward's own, detached
    old_log_probs: list[torch.Tensor | None]
    ref_log_probs: list[torch.Tensor] | None


def advantages(samples: batches.TrainSamples, old: list[torch.Tensor | None], ref: list[torch.Tensor] | None,
               hook: Callable[..., Any] | None, args: Any, device: torch.device) -> list[torch.Tensor]:
    """Each sample's reward on every response token, float32 on `device`; with a `hook`, what it
    sets as rollout_data["advantages"] (given these, the samples' tensors and the log-probs)."""
    out = [torch.full((n,), r, dtype=torch.float32, device=device)
           for r, n in zip(samples.rewards, samples.response_lengths)]
    if hook is None:
        return out
    rollout_data = {"rewards": list(samples.rewards), "loss_masks": samples.loss_masks,
                    "response_lengths": samples.response_lengths, "total_lengths": samples.total_lengths,
                    "tokens": samples.tokens, "log_probs": old, "ref_log_probs": ref,
                    "rollout_log_probs": samples.rollout_log_probs, "advantages": out}
    hook(args, rollout_data)
    return [torch.as_tensor(a, dtype=torch.float32, device=device) for a in rollout_data["advantages"]]


def empty_tokens(device: torch.device) -> torch.Tensor:
    """The sequence of an empty micro-batch: a prompt token and a response token (id 0)."""
    return torch.zeros(2, dtype=torch.long, device=device)


def empty_micro_batch(prepared: Prepared, device: torch.device) -> tuple[MicroBatch, list[torch.Tensor]]:
    """What a worker runs when its share of a step ran out before a peer's (its model calls
    are collectives the peers wait for): one sample of loss mask 0 with the optional tensors the
    real ones have; its loss is multiplied by 0 and its metrics are not counted."""
    zero = torch.zeros(1, dtype=torch.float32, device=device)
    batch = MicroBatch(response_lengths=[1], total_lengths=[2], loss_masks=[zero], advantages=[zero],
                       old_log_probs=[zero], ref_log_probs=None if prepared.ref_log_probs is None else [zero],
                       rollout_log_probs=None if prepared.samples.rollout_log_probs is None else [zero])
    return batch, [empty_tokens(device)]


def micro_batch(prepared: Prepared, mb: list[int]) -> tuple[MicroBatch, list[torch.Tensor]]:
    """The samples `mb` of `prepared` as a micro-batch, and their token sequences."""
    s = prepared.samples
    batch = MicroBatch(
        response_lengths=[s.response_lengths[i] for i in mb], total_lengths=[s.total_lengths[i] for i in mb],
        loss_masks=[s.loss_masks[i] for i in mb], advantages=[prepared.advantages[i] for i in mb],
        old_log_probs=[prepared.old_log_probs[i] for i in mb],  # type: ignore[misc]
        ref_log_probs=None if prepared.ref_log_probs is None else [prepared.ref_log_probs[i] for i in mb],
        rollout_log_probs=None if s.rollout_log_probs is None else [s.rollout_log_probs[i] for i in mb],
        rollout_mask_sums=None if s.rollout_mask_sums is None else [s.rollout_mask_sums[i] for i in mb])
    return batch, [s.tokens[i] for i in mb]


def custom_loss(hook: Callable[..., Any], args: Any, model: Any, batch: MicroBatch, tokens: list[torch.Tensor],
                reduce: Callable[..., Any], device: torch.device, bf16: bool) -> Any:
    """slime's `custom_loss(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)`, with the
    logits of one padded forward (bf16 autocast when `bf16`) packed as slime's
    [1, sum(total_lengths), vocab] float32."""
    ids, attention = batches.pad_tokens(tokens, device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits
    packed = torch.cat([logits[i, : int(t.shape[0])] for i, t in enumerate(tokens)]).float().unsqueeze(0)
    slime_batch = {
        "unconcat_tokens": tokens, "total_lengths": batch.total_lengths,
        "response_lengths": batch.response_lengths, "loss_masks": batch.loss_masks,
        "advantages": batch.advantages, "log_probs": batch.old_log_probs,
        "ref_log_probs": batch.ref_log_probs, "rollout_log_probs": batch.rollout_log_probs,
        "rollout_mask_sums": batch.rollout_mask_sums}
    return hook(args, slime_batch, packed, reduce)
