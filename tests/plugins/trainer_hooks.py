"""slime-signature trainer hooks for tests/train (each records that it ran)."""

import torch

CALLS: list[str] = []


def double_advantages(args, rollout_data):
    """custom advantage: twice the reward on every token."""
    CALLS.append("advantage")
    rollout_data["advantages"] = [torch.full((n,), 2.0 * r) for r, n in
                                  zip(rollout_data["rewards"], rollout_data["response_lengths"])]
    rollout_data["returns"] = rollout_data["advantages"]


def half_tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    """custom TIS: weight 0.5 on every token."""
    CALLS.append("tis")
    return pg_loss * 0.5, loss_masks, {"half": torch.full_like(pg_loss, 0.5)}


def constant_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    """custom pg-loss reducer: masked token sum / 1000 (slime's Dr. GRPO example)."""
    CALLS.append("reducer")
    mask = torch.cat(loss_masks)
    return lambda x: (x * mask).sum() / 1000.0


def sft_like_loss(args, batch, logits, sum_of_sample_mean):
    """custom loss: negative log-likelihood of the response tokens from slime's packed logits."""
    CALLS.append("loss")
    assert logits.dtype == torch.float32 and logits.dim() == 3 and logits.shape[0] == 1
    pieces = []
    end = 0
    for tokens, total, n in zip(batch["unconcat_tokens"], batch["total_lengths"], batch["response_lengths"]):
        end += total
        rows = logits[0, end - n - 1:end - 1].log_softmax(-1)
        pieces.append(rows.gather(-1, tokens[-n:].unsqueeze(-1)).squeeze(-1))
    loss = -sum_of_sample_mean(torch.cat(pieces))
    return loss, {"loss": loss.detach(), "nll": loss.detach()}


def count_train_data(args, rollout_id, train_data):
    """A user trainer for trainer=function: reports how many samples it got."""
    return {"samples": float(len(train_data["tokens"]))}


def draw_random_streams(args, batch, logits, sum_of_sample_mean):
    """custom loss: a zero loss through the logits, and one draw from each process-wide random
    stream (torch, numpy, Python) of this rank as metrics named after the rank, so a resumed
    trainer's next draws can be compared with an uninterrupted one's."""
    import random

    import numpy as np
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    loss = logits.sum() * 0.0
    return loss, {f"rng_torch_{rank}": torch.rand(()), f"rng_numpy_{rank}": torch.tensor(np.random.rand()),
                  f"rng_python_{rank}": torch.tensor(random.random())}


# what the recording hooks below saw (their last call)
SEEN: dict = {}


def record_advantages(args, rollout_data):
    """custom advantage: records what it got; integer advantages as plain lists (the trainer
    makes float32 tensors of them)."""
    CALLS.append("advantage")
    SEEN["advantage"] = (args, dict(rollout_data))
    rollout_data["advantages"] = [[1] * n for n in rollout_data["response_lengths"]]


def record_loss(args, batch, logits, sum_of_sample_mean):
    """custom loss: records what it got, then the SFT-like loss."""
    SEEN["loss"] = (args, dict(batch), logits.detach().clone())
    return sft_like_loss(args, batch, logits, sum_of_sample_mean)


def nll_without_a_loss_metric(args, batch, logits, sum_of_sample_mean):
    """custom loss: the SFT-like loss, reporting only `nll` (no `loss` metric)."""
    loss, _ = sft_like_loss(args, batch, logits, sum_of_sample_mean)
    return loss, {"nll": loss.detach()}


def list_advantages(args, rollout_data):
    """custom advantage: the reward on every token, as plain lists of Python floats."""
    rollout_data["advantages"] = [[float(r)] * n for r, n in
                                  zip(rollout_data["rewards"], rollout_data["response_lengths"])]


def mask_blind_loss(args, batch, logits, sum_of_sample_mean):
    """custom loss that reads no loss mask: a small L2 penalty on every logit it is given."""
    loss = 1e-3 * logits.pow(2).mean()
    return loss, {"loss": loss.detach()}
