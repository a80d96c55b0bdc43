"""Batched next-token sampling for the `hf` engine's static decode path.

One call samples every row of a batch: one log-softmax over [B, V], one batched top-k / top-p cut
(only over the rows that ask for one), one cumulative sum, and one `searchsorted` against a
uniform draw per row. Each row's draw comes from its own seeded `torch.Generator` (one scalar per
row per step), so a seeded request samples the same tokens alone or in any batch (up to float
rounding of its logits). This is inverse-CDF sampling: the same distribution as
`torch.multinomial`, with one random number per row instead of one per vocabulary entry (which
is what `multinomial` draws on CPU, and what made a Python loop of them a fifth of a decode step
at batch 32).

Log-probs follow `pipeline.engines.hf_decode`: `log_softmax(logits / temperature)[token]` before
the top-k / top-p cut; greedy rows (temperature 0) take the argmax and report
`log_softmax(logits)[token]`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from pipeline.engines.base import SamplingParams

__all__ = ["sample_batch"]


def sample_batch(logits: torch.Tensor, params: Sequence[SamplingParams],
                 generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, list[float]]:
    """Sample one token per row of `logits` [B, V] (float32).

    Returns the tokens as a [B] long tensor and their log-probs.
    """
    vocab = logits.shape[1]
    temps = [max(p.temperature, 0.0) for p in params]
    sampled = [i for i, t in enumerate(temps) if t > 0.0]
    scale = torch.tensor([t if t > 0.0 else 1.0 for t in temps], dtype=logits.dtype)
    logp = torch.log_softmax(logits / scale.unsqueeze(1), dim=-1)
    tokens = torch.zeros(len(temps), dtype=torch.long)
    if len(sampled) < len(temps):
        greedy = torch.tensor([i for i, t in enumerate(temps) if t <= 0.0], dtype=torch.long)
        tokens[greedy] = torch.argmax(logits.index_select(0, greedy), dim=-1)
    if sampled:
        rows = torch.tensor(sampled, dtype=torch.long)
        probs = logp.index_select(0, rows).exp()
        cut = [j for j, i in enumerate(sampled)
               if 0 < params[i].top_k < vocab or params[i].top_p < 1.0]
        if cut:
            probs = _cut(probs, [params[sampled[j]] for j in cut], cut)
        # float64 cumulative sums: a float32 running sum over 49k entries drifts by ~1e-5
        cdf = probs.double().cumsum_(dim=-1)
        draws = torch.tensor([torch.rand(1, generator=generators[i], dtype=torch.float64).item()
                              for i in sampled], dtype=torch.float64)
        target = draws * cdf[:, -1]
        picked = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
        tokens[rows] = picked.clamp_(max=vocab - 1)
    chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
    return tokens, chosen


def _cut(probs: torch.Tensor, params: list[SamplingParams], which: list[int]) -> torch.Tensor:
    """Zero the probabilities outside the top-k / nucleus of rows `which` of `probs` (one sort
    over those rows; renormalisation is implicit in inverse-CDF sampling)."""
    index = torch.tensor(which, dtype=torch.long)
    part = probs.index_select(0, index)
    sorted_p, order = torch.sort(part, dim=-1, descending=True)
    vocab = part.shape[1]
    ks = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params])
    top_ps = torch.tensor([p.top_p for p in params], dtype=part.dtype)
    rank = torch.arange(vocab).unsqueeze(0)
    keep = rank < ks.unsqueeze(1)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly above each token
    keep &= (before < top_ps.unsqueeze(1)) | (top_ps.unsqueeze(1) >= 1.0)
    keep[:, 0] = True
    sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    probs = probs.clone()
    probs[index] = torch.zeros_like(part).scatter_(1, order, sorted_p)
    return probs
