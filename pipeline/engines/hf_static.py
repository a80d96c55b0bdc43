"""The `hf` engine's static decode path: a pre-allocated KV cache, lean steps, batched sampling.

`StaticDecodeBatch` has the interface of `hf_decode.DecodeBatch` (the legacy path, kept as
`engine.decode_impl=legacy`) and the same semantics; what changes is how the work is done:

- One key/value buffer [2, layers, rows, kv_heads, columns, head_dim] is allocated once and grown
  geometrically (never per step). All rows write their next key at the same column (`column`),
  so the batch stays left-aligned as in the legacy path, but nothing is concatenated or padded
  per step: a joining row's prefilled cache is copied into free rows so that its prompt ends at
  `column`; a finished row's slot is refilled by moving the last row into it (one copy of one
  row); leading columns that are padding for every row are skipped by reading from `start`, and
  reclaimed by one shift when the buffer is full.
- Decode steps run `hf_lean.LeanDecoder` (4 matmuls per layer, attention over the live columns).
- Prefill is the transformers forward (as in the legacy path), so a row's prompt cache and its
  first token are computed exactly as before; rows joining together with the same prompt (a
  GRPO group's n samples) share one prefill row, whose cache and logits each of them copies.
- Every tensor lives on the decoder's device (`LeanDecoder.device`, the model's), except the
  first-column bookkeeping `_first` (read as Python ints, kept on the CPU so that reading it does
  not wait for the device).
- Sampling is one batched call (`hf_sampling.sample_batch`; with the decoder's native kernels,
  one C call).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from pipeline.engines.hf_decode import Row, cache_keyword, finish_check, prefill
from pipeline.engines.hf_lean import LeanDecoder
from pipeline.engines.hf_sampling import sample_batch

__all__ = ["StaticDecodeBatch", "distinct_prompts"]

logger = logging.getLogger(__name__)

# columns added beyond the first need, and the smallest growth step
_MIN_COLUMNS = 128


class StaticDecodeBatch:
    """Rows in flight over a pre-allocated KV cache (see module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, pad_id: int, decoder: LeanDecoder) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.decoder = decoder
        self.rows: list[Row] = []
        self.tokens_generated = 0
        self._cache_kw = cache_keyword(model)
        self._device = decoder.device
        self._cache: torch.Tensor | None = None  # [2, layers, rows, kv_heads, columns, dim]
        # [rows, columns] real tokens
        self._valid = torch.zeros((0, 0), dtype=torch.bool, device=self._device)
        self._first = torch.zeros(0, dtype=torch.long, device="cpu")  # first real column of each row
        self._pos = torch.zeros(0, dtype=torch.long, device=self._device)  # position of the token fed next
        self._last = torch.zeros(0, dtype=torch.long, device=self._device)  # token fed next
        self._column = 0  # where the next key/value of every row is written

    def __len__(self) -> int:
        return len(self.rows)

    # -- storage -------------------------------------------------------------------------------

    def _reserve(self, rows: int, width: int) -> None:
        """Make room for `rows` rows and for the next write at column max(width, column)
        (dead leading columns are reclaimed first; growth is geometric)."""
        cap_rows, cap_cols = self._capacity()
        n = len(self.rows)
        if max(width, self._column) + 1 > cap_cols and n:
            self._shift(-int(self._first[:n].min()))
        need_cols = max(width, self._column) + 1
        if rows <= cap_rows and need_cols <= cap_cols:
            return
        new_rows = max(rows, 2 * cap_rows) if rows > cap_rows else cap_rows
        new_cols = max(need_cols + _MIN_COLUMNS, 2 * cap_cols) if need_cols > cap_cols else cap_cols
        cache = self.decoder.new_cache(new_rows, new_cols)
        valid = torch.zeros((new_rows, new_cols), dtype=torch.bool, device=self._device)
        c = self._column
        if self._cache is not None and n:
            cache[:, :, :n, :, :c] = self._cache[:, :, :n, :, :c]
            valid[:n, :c] = self._valid[:n, :c]
        self._cache, self._valid = cache, valid
        for name in ("_first", "_pos", "_last"):
            old = getattr(self, name)
            grown = torch.zeros(new_rows, dtype=torch.long, device=old.device)
            grown[:n] = old[:n]
            setattr(self, name, grown)
        logger.debug("static KV cache: %d rows x %d columns", new_rows, new_cols)

    def _capacity(self) -> tuple[int, int]:
        return (0, 0) if self._cache is None else (self._cache.shape[2], self._cache.shape[4])

    def _shift(self, by: int) -> None:
        """Move every live row's columns by `by` (negative: left)."""
        n, c = len(self.rows), self._column
        if by == 0 or self._cache is None:
            return
        lo = max(0, -by)
        block = self._cache[:, :, :n, :, lo:c].clone()
        mask = self._valid[:n, lo:c].clone()
        self._valid[:n] = False
        self._cache[:, :, :n, :, lo + by: c + by] = block
        self._valid[:n, lo + by: c + by] = mask
        self._first[:n] += by
        self._column = c + by

    # -- admission -----------------------------------------------------------------------------

    def admit(self, new_rows: list[Row]) -> None:
        """Prefill `new_rows` (transformers forward) and copy their cache into free rows. Rows
        with the same prompt (the n samples of a GRPO group) share one prefill: its keys,
        values and first-token logits are copied to each of them."""
        if not new_rows:
            return
        distinct, source = distinct_prompts(new_rows)
        cache, mask, logits = prefill(self.model, distinct, self.pad_id, self._cache_kw)
        shared = len(distinct) < len(new_rows)
        picks = torch.tensor(source, device=self._device)
        if shared:
            mask, logits = mask[picks], logits[picks]
        width, n, m = mask.shape[1], len(self.rows), len(new_rows)
        if not self.rows:
            self._column = 0
        self._reserve(n + m, width)
        if self._column < width:  # the new prompts are longer than the running rows
            self._shift(width - self._column)
            self._column = width
        assert self._cache is not None
        lo, hi = self._column - width, self._column
        for i, layer in enumerate(cache.layers):
            self._cache[0, i, n:n + m, :, lo:hi] = layer.keys[picks] if shared else layer.keys
            self._cache[1, i, n:n + m, :, lo:hi] = layer.values[picks] if shared else layer.values
        self._valid[n:n + m] = False
        self._valid[n:n + m, lo:hi] = mask.bool()
        lengths = torch.tensor([len(r.prompt_ids) for r in new_rows], device="cpu")  # where `_first` is
        self._first[n:n + m] = hi - lengths
        self._pos[n:n + m] = lengths.to(self._device)
        self.rows.extend(new_rows)
        self._accept(new_rows, logits, offset=n)

    # -- stepping ------------------------------------------------------------------------------

    def decode(self) -> None:
        """One decode step for every row in the batch."""
        n = len(self.rows)
        if not n:
            return
        self._reserve(n, 0)
        assert self._cache is not None
        column = self._column
        self._valid[:n, column] = True
        start = int(self._first[:n].min())
        live = self._valid[:n, start: column + 1]
        bias = torch.zeros(live.shape, dtype=self.decoder.dtype, device=self._device)
        bias.masked_fill_(~live, float("-inf"))
        logits = self.decoder.step(self._last[:n], self._pos[:n], self._cache, column, start,
                                   bias.view(n, 1, 1, -1))
        self._column += 1
        self._pos[:n] += 1
        self._accept(self.rows, logits, offset=0)

    def _accept(self, rows: list[Row], logits: torch.Tensor, offset: int) -> None:
        tokens, log_probs = sample_batch(logits, [r.sampling for r in rows], [r.generator for r in rows],
                                         self.decoder.native)
        self._last[offset: offset + len(rows)] = tokens
        self.tokens_generated += len(rows)
        for row, tok, lp in zip(rows, tokens.tolist(), log_probs):
            row.output_ids.append(tok)
            row.log_probs.append(lp)
            finish_check(row, self.tokenizer)

    def release_finished(self) -> list[Row]:
        """Remove rows that have a finish reason (the last row moves into each freed slot)."""
        done = [r for r in self.rows if r.finish_reason is not None]
        if not done:
            return []
        assert self._cache is not None
        c = self._column
        for i in reversed([i for i, r in enumerate(self.rows) if r.finish_reason is not None]):
            last = len(self.rows) - 1
            if i != last:
                self._cache[:, :, i, :, :c] = self._cache[:, :, last, :, :c]
                self._valid[i, :c] = self._valid[last, :c]
                for t in (self._first, self._pos, self._last):
                    t[i] = t[last]
                self.rows[i] = self.rows[last]
            self.rows.pop()
        if not self.rows:
            self._column = 0
        return done


def distinct_prompts(rows: list[Row]) -> tuple[list[Row], list[int]]:
    """The first row of each distinct prompt (in order) and, per row, the index of its prompt
    among them."""
    first: dict[tuple[int, ...], int] = {}
    distinct: list[Row] = []
    source: list[int] = []
    for row in rows:
        key = tuple(row.prompt_ids)
        if key not in first:
            first[key] = len(distinct)
            distinct.append(row)
        source.append(first[key])
    return distinct, source
