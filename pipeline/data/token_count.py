"""Exact token counts of plain-ASCII prompts for GPT-2-style byte-level BPE, without encoding
each prompt: counts of the prompt's pre-tokens, each unique pre-token encoded once.

A `tokenizers` pipeline with no normalizer, a `ByteLevel(add_prefix_space=False,
use_regex=True)` pre-tokenizer and a BPE model (no dropout) encodes a text, after extracting
added tokens, by splitting it with the GPT-2 regex and running BPE on every piece on its own;
so `len(encode(text)) == sum(len(encode(piece)) for piece in pieces)` when the text holds no
added token. For printable ASCII (0x20..0x7E) the regex's classes are exactly `\\p{L}` =
`[A-Za-z]`, `\\p{N}` = `[0-9]`, `\\s` = space, so Python's `re` splits identically (both
engines take the first alternative that matches, greedily). A piece encoded alone splits to
itself (the alternatives that matched it in context match it alone). Any other text (non-ASCII,
tabs/newlines, an added token's content) is encoded in full as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import chain
from typing import Any

import numpy as np

__all__ = ["PretokenCounter"]

# the GPT-2 pattern of `tokenizers`' ByteLevel pre-tokenizer, restricted to printable ASCII
_GPT2_ASCII = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
# unique pre-tokens remembered between batches (bounded memory on long-tailed vocabularies)
_MAX_CACHE = 1_000_000

Encode = Callable[..., list[Any]]


class PretokenCounter:
    """Token counts of batches of texts; build with `create(tokenizer)` (None: not eligible)."""

    def __init__(self, added: list[str]) -> None:
        self._added = re.compile("|".join(map(re.escape, sorted(added, key=len, reverse=True)))) if added else None
        self._cache: dict[str, int] = {}

    @classmethod
    def create(cls, tokenizer: Any) -> PretokenCounter | None:
        """A counter for a `tokenizers.Tokenizer` whose pipeline allows it, else None."""
        try:
            spec = json.loads(tokenizer.to_str())
        except (AttributeError, ValueError, TypeError):
            return None
        pre, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
        if (spec.get("normalizer") is not None or pre.get("type") != "ByteLevel"
                or pre.get("add_prefix_space", True) or not pre.get("use_regex", True)
                or model.get("type") != "BPE" or model.get("dropout") not in (None, 0, 0.0)):
            return None
        added = [t["content"] for t in spec.get("added_tokens") or []]
        if any(not a for a in added):
            return None
        return cls(added)

    def count(self, batch: list[str], encode: Encode) -> np.ndarray:
        """Token counts (no special tokens) of `batch`; `encode` is the batch encoder."""
        out = np.zeros(len(batch), dtype=np.int32)
        simple = [i for i, t in enumerate(batch) if t.isascii() and t.isprintable()]
        if self._added is not None and simple:
            # one search over the batch; any hit (or a hit across the joins) is checked per text
            if self._added.search("\n".join([batch[i] for i in simple])):
                simple = [i for i in simple if not self._added.search(batch[i])]
        if len(simple) < len(batch):
            chosen = set(simple)
            hard = [i for i in range(len(batch)) if i not in chosen]
            encs = encode([batch[i] for i in hard], add_special_tokens=False)
            out[hard] = [len(e) for e in encs]
        if simple:
            cache = self._cache
            findall = _GPT2_ASCII.findall
            pieces = [findall(batch[i]) for i in simple]
            new = set(chain.from_iterable(pieces))  # this batch's unique pieces (C-level)
            if len(cache) + len(new) > _MAX_CACHE:
                cache.clear()
            else:
                new = {p for p in new if p not in cache}
            if new:
                words = list(new)
                cache.update(zip(words, (len(e) for e in encode(words, add_special_tokens=False))))
            get = cache.__getitem__
            out[simple] = [sum(map(get, ps)) for ps in pieces]
        return out
