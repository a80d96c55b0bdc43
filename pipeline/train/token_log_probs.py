"""Log-prob of each target token and entropy of each position's distribution, in row chunks.

`token_log_probs(logits [R, V], targets [N], temperature, rows [N])` gives, per scored row,
`log_softmax(logits / temperature)[target]` and the entropy of `softmax(logits / temperature)`,
both in float32 (float64 for float64 logits) and both differentiable; rows not in `rows` (the
padding of a right-padded batch) are skipped and get a zero gradient. It equals
`torch.log_softmax` followed by a gather and `-(p * log p).sum()` up to rounding, but never
builds a float32 [N, V] tensor: it walks the rows in chunks of about a megabyte (`CHUNK_BYTES`),
so each chunk's float32 copy, its exponentials and the gradient stay in the CPU's cache, and the
backward pass recomputes the probabilities from the saved logits and per-row log-sum-exp
instead of keeping them.

Why: with SmolLM2's 49,152-token vocabulary the output logits of a training micro-batch are the
largest tensors of the step (16 samples x 48 positions: 38 M values), and the unfused chain
(a float32 copy, log-softmax, exp and multiply for the entropy, the log-softmax backward, the
cast of the gradient back to bfloat16) streamed them through memory about ten times: 0.35 s of
forward and backward at that size on 2 cores, against 0.08 s chunked (docs/performance.md,
"History").

Gradient, with p = softmax(z / T), log p its log, H the entropy, g and h the incoming gradients of
the log-prob and the entropy: dz_j = (g (1[j = target] - p_j) - h p_j (log p_j + H)) / T.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CHUNK_BYTES", "token_log_probs"]

# float32 bytes of logits handled per chunk (rows = CHUNK_BYTES // (4 * vocab), at least one): a
# chunk and its exponentials fit the per-core caches of current x86 CPUs (1-2 MB L2)
CHUNK_BYTES = 1 << 20


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                    rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [N], entropies [N]) of `targets` [N] under `softmax(logits[rows] / temperature)`
    (module docstring); float32, or float64 for float64 logits. `logits` is [R, V]; `rows` [N]
    picks the rows to score (all when None; the others get a zero gradient), so padding
    positions are skipped without a copy of the rest."""
    if logits.dim() != 2:
        raise ValueError(f"token_log_probs needs logits [R, V], got {tuple(logits.shape)}")
    rows = torch.arange(logits.shape[0], device=logits.device) if rows is None else rows
    if rows.dim() != 1 or targets.shape != rows.shape:
        raise ValueError(f"token_log_probs needs rows [N] and targets [N], got {tuple(rows.shape)} "
                         f"and {tuple(targets.shape)}")
    if temperature <= 0:
        raise ValueError(f"token_log_probs needs a temperature > 0, got {temperature}")
    if torch.unique(rows).numel() != rows.numel():
        raise ValueError("token_log_probs needs distinct rows")
    return _TokenLogProbs.apply(logits, targets, rows, float(temperature))


def _rows_per_chunk(vocab: int) -> int:
    return max(1, CHUNK_BYTES // (4 * max(vocab, 1)))


def _scaled(logits: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype, temperature: float) -> torch.Tensor:
    """A private `dtype` copy of `rows`, divided by the temperature."""
    z = logits.index_select(0, rows)
    z = z.to(dtype) if z.dtype != dtype else z
    if temperature != 1.0:
        z.div_(temperature)
    return z


class _TokenLogProbs(torch.autograd.Function):
    """The chunked forward and backward of `token_log_probs`."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, rows: torch.Tensor, temperature: float) -> Any:
        dtype = torch.promote_types(logits.dtype, torch.float32)
        n = rows.shape[0]
        log_probs = torch.empty(n, dtype=dtype, device=logits.device)
        entropy = torch.empty(n, dtype=dtype, device=logits.device)
        log_norm = torch.empty(n, dtype=dtype, device=logits.device)  # per row: logsumexp(z / T)
        step = _rows_per_chunk(logits.shape[1])
        for start in range(0, n, step):
            stop = min(start + step, n)
            z = _scaled(logits, rows[start:stop], dtype, temperature)
            top = z.amax(-1, keepdim=True)
            z.sub_(top)  # z - max: exp cannot overflow
            e = z.exp()
            total = e.sum(-1, keepdim=True)
            log_total = total.log()
            # H = log total - sum(e * z) / total (z shifted)
            dot = torch.linalg.vecdot(e, z).unsqueeze(1)
            entropy[start:stop] = (log_total - dot / total).squeeze(1)
            log_probs[start:stop] = (z.gather(1, targets[start:stop].unsqueeze(1)) - log_total).squeeze(1)
            log_norm[start:stop] = (top + log_total).squeeze(1)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, targets, rows, log_norm, entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx: Any, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> Any:
        logits, targets, rows, log_norm, entropy = ctx.saved_tensors
        if grad_log_probs is None and grad_entropy is None:
            return None, None, None, None
        temperature = ctx.temperature
        dtype = log_norm.dtype
        grad = torch.zeros_like(logits)  # rows not scored keep 0
        step = _rows_per_chunk(logits.shape[1])
        for start in range(0, rows.shape[0], step):
            stop = min(start + step, rows.shape[0])
            log_p = _scaled(logits, rows[start:stop], dtype, temperature).sub_(log_norm[start:stop].unsqueeze(1))
            p = log_p.exp()
            if grad_entropy is not None:
                # -h p (log p + H), built in log_p's buffer
                h = grad_entropy[start:stop].unsqueeze(1)
                chunk = log_p.add_(entropy[start:stop].unsqueeze(1)).mul_(p).mul_(-h)
                if grad_log_probs is not None:
                    chunk.addcmul_(p, grad_log_probs[start:stop].unsqueeze(1), value=-1.0)
            else:
                chunk = p.mul_(-grad_log_probs[start:stop].unsqueeze(1))  # type: ignore[index]
            if grad_log_probs is not None:
                chunk.scatter_add_(1, targets[start:stop].unsqueeze(1), grad_log_probs[start:stop].unsqueeze(1))
            if temperature != 1.0:
                chunk.div_(temperature)
            grad.index_copy_(0, rows[start:stop], chunk.to(grad.dtype))
        return grad, None, None, None
