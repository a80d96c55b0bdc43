"""Batched next-token sampling for the `hf` engine's static decode path.

One call samples every row of a batch: one log-softmax over [B, V], one batched top-k / top-p cut
(only over the rows that ask for one), and a cumulative-sum search against one uniform draw per
row. Each row's draw comes from its own seeded `torch.Generator` (one scalar per row per step), so
a seeded request samples the same tokens alone or in any batch (up to float rounding of its
logits). This is inverse-CDF sampling (searched in two levels, blocks then entries, see
`_inverse_cdf`): the same distribution as `torch.multinomial`, with one random number per row
instead of one per vocabulary entry (which is what `multinomial` draws on CPU, and what made a
Python loop of them a fifth of a decode step at batch 32).

With the native kernels (`native_kernels.NativeKernels.sample`, used by the static path when its
decoder runs on them) rows without top-k / top-p are sampled in one C call: the same draws and
the same two-level search, in two passes over each row's logits.

Every tensor is made on the device of the logits (the CPU, or the engine's GPU), and each row's
draw comes from its generator on that device: the uniforms are drawn there and gathered into one
tensor, no per-row transfer (on the CPU the same numbers the per-row `.item()` draws were).

Log-probs follow `pipeline.engines.hf_decode`: `log_softmax(logits / temperature)[token]` before
the top-k / top-p cut; greedy rows (temperature 0) take the argmax and report
`log_softmax(logits)[token]`.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from pipeline.engines.base import SamplingParams

__all__ = ["sample_batch"]

# entries per block of the two-level inverse-CDF search
_BLOCK = 512


def sample_batch(logits: torch.Tensor, params: Sequence[SamplingParams],
                 generators: Sequence[torch.Generator], kernels: Any = None) -> tuple[torch.Tensor, list[float]]:
    """Sample one token per row of `logits` [B, V] (float32).

    Returns the tokens as a [B] long tensor and their log-probs. With `kernels` (a
    `native_kernels.NativeKernels`) and no row asking for top-k / top-p, one C call does the
    work (the same draws from the same generators, the same two-level search; see
    `NativeKernels.sample` for what is rounded differently).
    """
    vocab = logits.shape[1]
    device = logits.device
    temps = [max(p.temperature, 0.0) for p in params]
    sampled = [i for i, t in enumerate(temps) if t > 0.0]
    if kernels is not None and not any(0 < params[i].top_k < vocab or params[i].top_p < 1.0 for i in sampled):
        draws = [torch.rand(1, generator=generators[i], dtype=torch.float64).item() if t > 0.0 else 0.0
                 for i, t in enumerate(temps)]
        tokens, chosen = kernels.sample(logits, torch.tensor(temps), torch.tensor(draws, dtype=torch.float64))
        return tokens, chosen.tolist()
    if all(t in (0.0, 1.0) for t in temps):  # x / 1.0 == x: skip a [B, V] division
        logp = torch.log_softmax(logits, dim=-1)
    else:
        scale = torch.tensor([t if t > 0.0 else 1.0 for t in temps], dtype=logits.dtype, device=device)
        logp = torch.log_softmax(logits / scale.unsqueeze(1), dim=-1)
    tokens = torch.zeros(len(temps), dtype=torch.long, device=device)
    if len(sampled) < len(temps):
        greedy = torch.tensor([i for i, t in enumerate(temps) if t <= 0.0], dtype=torch.long, device=device)
        tokens[greedy] = torch.argmax(logits.index_select(0, greedy), dim=-1)
    if sampled:
        rows = torch.tensor(sampled, dtype=torch.long, device=device)
        probs = (logp if len(sampled) == len(temps) else logp.index_select(0, rows)).exp()
        cut = [j for j, i in enumerate(sampled)
               if 0 < params[i].top_k < vocab or params[i].top_p < 1.0]
        if cut:
            probs = _cut(probs, [params[sampled[j]] for j in cut], cut)
        draws = torch.cat([torch.rand(1, generator=generators[i], dtype=torch.float64, device=device)
                           for i in sampled])
        picked = _inverse_cdf(probs, draws)
        tokens[rows] = picked
    chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
    return tokens, chosen


def _inverse_cdf(probs: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """The index i of each row of `probs` [S, V] (unnormalised, >= 0) with CDF(i - 1) <= u *
    total < CDF(i) for the row's draw u in [0, 1); never an index of probability 0.

    Two levels of cumulative sums in float64 (a float32 running sum over 49k entries drifts by
    ~1e-5): over the sums of blocks of `_BLOCK` entries to pick the block, then inside it to pick
    the entry. A full-width float64 cumulative sum is a sequential scalar loop that cost
    more than half of the sampling time at batch 64; the block sums vectorise."""
    rows = probs.shape[0]
    pad = -probs.shape[1] % _BLOCK
    blocks = torch.nn.functional.pad(probs, (0, pad)) if pad else probs
    blocks = blocks.view(rows, -1, _BLOCK)
    sums = blocks.sum(dim=-1).double()  # [S, blocks]; a float32 sum of 512 entries is exact to ~1e-7
    outer = sums.cumsum(dim=-1)
    target = (draws * outer[:, -1]).unsqueeze(1)
    block = torch.searchsorted(outer, target, right=True)  # [S, 1]
    # rounding can put the target at the very end: take the last block with any mass
    nonempty = torch.arange(outer.shape[1], device=probs.device) * (sums > 0)
    block = torch.minimum(block, nonempty.amax(dim=-1, keepdim=True))
    before = torch.where(block > 0, outer.gather(1, (block - 1).clamp_(min=0)), 0.0)
    inner = blocks.gather(1, block.unsqueeze(2).expand(-1, -1, _BLOCK)).squeeze(1)  # [S, BLOCK]
    within = torch.searchsorted(torch.cumsum(inner, dim=-1, dtype=torch.float64),
                                target - before, right=True)
    last = (torch.arange(_BLOCK, device=probs.device) * (inner > 0)).amax(dim=-1, keepdim=True)
    within = torch.where(within >= _BLOCK, last, within)
    return (block * _BLOCK + within).squeeze(1)


def _cut(probs: torch.Tensor, params: list[SamplingParams], which: list[int]) -> torch.Tensor:
    """Zero the probabilities outside the top-k / nucleus of rows `which` of `probs` (one sort
    over those rows; renormalisation is implicit in inverse-CDF sampling)."""
    device = probs.device
    index = torch.tensor(which, dtype=torch.long, device=device)
    part = probs.index_select(0, index)
    sorted_p, order = torch.sort(part, dim=-1, descending=True)
    vocab = part.shape[1]
    ks = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)
    top_ps = torch.tensor([p.top_p for p in params], dtype=part.dtype, device=device)
    rank = torch.arange(vocab, device=device).unsqueeze(0)
    keep = rank < ks.unsqueeze(1)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly above each token
    keep &= (before < top_ps.unsqueeze(1)) | (top_ps.unsqueeze(1) >= 1.0)
    keep[:, 0] = True
    sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    probs = probs.clone()
    probs[index] = torch.zeros_like(part).scatter_(1, order, sorted_p)
    return probs
