"""The continuous-batching decode loop behind the `hf` engine (no asyncio here).

A `DecodeBatch` holds the rows being generated and one shared KV cache (`DynamicCache`,
left-padded). Every `step()`:
  1. rows that finished (or were aborted) leave the batch (`batch_select_indices`),
  2. newly admitted rows are prefilled in their own cache, which is then merged into the running
     one by left-padding the shorter of the two (continuous batching: new requests join while
     others are mid-generation),
  3. one decode step runs for every row.

Sampling is per row: temperature, top-k, top-p, a per-row `torch.Generator` (seeded from the
request seed), stop token ids and stop strings. The log-prob reported for a token is
`log_softmax(logits / temperature)[token]` — the plain distribution at temperature, before the
top-k / top-p cut (what SGLang returns and slime stores); greedy rows (temperature 0) report
`log_softmax(logits)[token]`.

Every tensor is made on the model's device (`model_device`: the CPU, or the engine's GPU), and a
row's generator lives there too (`torch.multinomial` draws on the device of the probabilities).

Batched float32 matmuls round differently for different batch shapes (size, left padding), so a
row's logits differ in their last bits with what it shares the batch with. The log-probs of a
`batch_invariant` request are therefore recomputed when it finishes, by `log_probs_alone`: one
forward pass over prompt + output at batch size 1, the same bits whatever the batch. Its tokens
are still sampled from the batched logits; with a seed they differ between batches only if a
draw lands within rounding of a boundary between two tokens.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from pipeline.engines.base import FinishReason, SamplingParams

__all__ = ["Row", "DecodeBatch", "sample_next", "log_probs_alone", "prefill", "finish_check",
           "cache_keyword", "model_device"]

logger = logging.getLogger(__name__)


@dataclass
class Row:
    """One request being generated."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    # on the device the row samples on (the model's)
    generator: torch.Generator
    stop_ids: frozenset[int]
    # called once, from the decode thread, when the row finishes
    on_done: Callable[["Row"], None]
    output_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    # abort generation: rows submitted before the latest abort_all are aborted
    abort_epoch: int = 0
    error: BaseException | None = None
    # (first output index, weight version) from admission on: the version of every output token
    version_marks: list[tuple[int, int]] = field(default_factory=list)


def sample_next(logits: torch.Tensor, rows: list[Row]) -> tuple[list[int], list[float]]:
    """Sample one token per row from `logits` [B, V] (float32); return tokens and log-probs."""
    temps = torch.tensor([max(r.sampling.temperature, 0.0) for r in rows], dtype=logits.dtype, device=logits.device)
    greedy = temps <= 0.0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps).unsqueeze(1)
    logp = torch.log_softmax(scaled, dim=-1)
    probs = logp.exp()
    need_cut = [(0 < r.sampling.top_k < logits.shape[1]) or r.sampling.top_p < 1.0 for r in rows]
    if any(need_cut):
        probs = _top_k_top_p(probs, rows, need_cut)
    tokens: list[int] = []
    for i, row in enumerate(rows):
        if bool(greedy[i]):
            tokens.append(int(torch.argmax(logits[i])))
        else:
            tokens.append(int(torch.multinomial(probs[i], 1, generator=row.generator)))
    idx = torch.tensor(tokens, device=logits.device).unsqueeze(1)
    chosen = logp.gather(1, idx).squeeze(1).tolist()
    return tokens, chosen


def log_probs_alone(model: Any, row: Row) -> list[float]:
    """The log-probs of `row.output_ids` from one forward pass over prompt + output at batch
    size 1 (no padding, no cache), by the formula of `sample_next`."""
    n = len(row.output_ids)
    device = model_device(model)
    ids = torch.tensor([row.prompt_ids + row.output_ids[:-1]], dtype=torch.long, device=device)
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=n).logits[0, -n:, :].float()
    if row.sampling.temperature > 0:
        logits = logits / torch.tensor(row.sampling.temperature, dtype=logits.dtype, device=device)
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(row.output_ids, device=device).unsqueeze(1)).squeeze(1).tolist()


def model_device(model: Any) -> torch.device:
    """The device of `model`'s weights (where its inputs and the decode state are made)."""
    return next(model.parameters()).device


def _top_k_top_p(probs: torch.Tensor, rows: list[Row], need_cut: list[bool]) -> torch.Tensor:
    """Zero the probabilities outside each row's top-k / nucleus (renormalisation is implicit:
    `torch.multinomial` takes unnormalised weights)."""
    probs = probs.clone()
    for i, row in enumerate(rows):
        if not need_cut[i]:
            continue
        p = probs[i]
        sorted_p, order = torch.sort(p, descending=True)
        keep = torch.ones_like(sorted_p, dtype=torch.bool)
        k = row.sampling.top_k
        if 0 < k < p.shape[0]:
            keep[k:] = False
        if row.sampling.top_p < 1.0:
            before = torch.cumsum(sorted_p, 0) - sorted_p  # mass strictly above this token
            keep &= before < row.sampling.top_p
        keep[0] = True
        mask = torch.zeros_like(keep)
        mask[order] = keep
        probs[i] = torch.where(mask, p, torch.zeros_like(p))
    return probs


def prefill(model: Any, rows: list[Row], pad_id: int, cache_kw: str) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """One forward pass over the left-padded prompts of `rows` with a fresh `DynamicCache`.

    Returns the filled cache, the [B, W] mask (1 for real tokens) and float32 last-token logits.
    """
    from transformers import DynamicCache

    width = max(len(r.prompt_ids) for r in rows)
    device = model_device(model)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, device=device)
        mask[i, width - len(r.prompt_ids):] = 1
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                use_cache=True, logits_to_keep=1, **{cache_kw: cache})
    return cache, mask, out.logits[:, -1, :].float()


def cache_keyword(model: Any) -> str:
    """The forward keyword of the KV cache (transformers >= 5.2x renamed `past_key_values`)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def finish_check(row: Row, tokenizer: Any) -> None:
    """Set `row.finish_reason` if its last token ends it (stop id, stop string, length)."""
    if row.output_ids[-1] in row.stop_ids:
        row.finish_reason = "stop"
    elif row.sampling.stop and _hit_stop_string(row, tokenizer):
        row.finish_reason = "stop"
    elif len(row.output_ids) >= row.max_new_tokens:
        row.finish_reason = "length"


def _hit_stop_string(row: Row, tokenizer: Any) -> bool:
    longest = max(len(s) for s in row.sampling.stop)
    # a stop string spans at most `longest` tokens (each token decodes to >= 1 char)
    tail = tokenizer.decode(row.output_ids[-(longest + 1):], skip_special_tokens=True)
    return any(s in tail for s in row.sampling.stop)


class DecodeBatch:
    """Rows in flight plus their shared, left-padded KV cache."""

    def __init__(self, model: Any, tokenizer: Any, pad_id: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.rows: list[Row] = []
        self.cache: Any = None
        # [B, L] 1 for real tokens, 0 for left padding
        self.mask: torch.Tensor | None = None
        self.last: torch.Tensor | None = None  # [B, 1] token to feed next
        self.tokens_generated = 0
        self._cache_kw = cache_keyword(model)
        self._device = model_device(model)

    def __len__(self) -> int:
        return len(self.rows)

    # -- admission -----------------------------------------------------------------------------

    def admit(self, new_rows: list[Row]) -> None:
        """Prefill `new_rows` and merge them into the running batch."""
        if not new_rows:
            return
        cache, mask, logits = prefill(self.model, new_rows, self.pad_id, self._cache_kw)
        self._merge(new_rows, cache, mask)  # the cache is filled in place
        self._accept(new_rows, logits, offset=len(self.rows) - len(new_rows))

    def _merge(self, new_rows: list[Row], cache: Any, mask: torch.Tensor) -> None:
        if not self.rows:
            self.rows, self.cache, self.mask = list(new_rows), cache, mask
            self.last = torch.zeros((len(new_rows), 1), dtype=torch.long, device=self._device)
            return
        assert self.mask is not None and self.last is not None
        old_len, new_len = self.mask.shape[1], mask.shape[1]
        width = max(old_len, new_len)
        for old_layer, new_layer in zip(self.cache.layers, cache.layers):
            old_layer.keys = torch.cat(
                [_left_pad(old_layer.keys, width), _left_pad(new_layer.keys, width)], dim=0)
            old_layer.values = torch.cat(
                [_left_pad(old_layer.values, width), _left_pad(new_layer.values, width)], dim=0)
        self.mask = torch.cat([_left_pad(self.mask, width), _left_pad(mask, width)], dim=0)
        self.last = torch.cat([self.last, torch.zeros((len(new_rows), 1), dtype=torch.long, device=self._device)])
        self.rows.extend(new_rows)

    # -- stepping ------------------------------------------------------------------------------

    def decode(self) -> None:
        """One decode step for every row in the batch."""
        if not self.rows:
            return
        assert self.mask is not None and self.last is not None
        self.mask = torch.cat([self.mask, torch.ones((len(self.rows), 1), dtype=torch.long, device=self._device)], 1)
        position_ids = (self.mask.sum(1, keepdim=True) - 1)
        out = self.model(
            input_ids=self.last, attention_mask=self.mask, position_ids=position_ids,
            use_cache=True, **{self._cache_kw: self.cache},
        )
        self._accept(self.rows, out.logits[:, -1, :].float(), offset=0)

    def _accept(self, rows: list[Row], logits: torch.Tensor, offset: int) -> None:
        assert self.last is not None
        tokens, log_probs = sample_next(logits, rows)
        self.tokens_generated += len(rows)
        for i, (row, tok, lp) in enumerate(zip(rows, tokens, log_probs)):
            row.output_ids.append(tok)
            row.log_probs.append(lp)
            self.last[offset + i, 0] = tok
            finish_check(row, self.tokenizer)

    def release_finished(self) -> list[Row]:
        """Remove rows that have a finish reason; return them. Also trims all-pad columns."""
        done = [r for r in self.rows if r.finish_reason is not None]
        if not done:
            return []
        keep = [i for i, r in enumerate(self.rows) if r.finish_reason is None]
        if not keep:
            self.rows, self.cache, self.mask, self.last = [], None, None, None
            return done
        assert self.mask is not None and self.last is not None
        index = torch.tensor(keep, dtype=torch.long, device=self._device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        self.last = self.last[index]
        self.rows = [self.rows[i] for i in keep]
        # drop leading columns that are padding for every remaining row
        lead = int((self.mask.cumsum(1) == 0).sum(1).min())
        if lead > 0:
            self.mask = self.mask[:, lead:]
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, lead:, :]
                layer.values = layer.values[:, :, lead:, :]
        return done


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad the sequence dim (dim -2 for [B, H, L, D] caches, dim 1 for [B, L] masks)."""
    dim = 1 if t.dim() == 2 else 2
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)
