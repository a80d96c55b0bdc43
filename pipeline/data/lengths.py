"""Prompt token lengths for the max-prompt-length filter: batched, fast, cached on disk.

Counts match slime's `len(tokenizer.encode(prompt, add_special_tokens=False))`. With a fast
(Rust) tokenizer the texts are encoded in batches by `tokenizers` itself; results are cached
as `.npz` files under `<cache_dir>/prompt_lengths/` keyed by a hash of (data fingerprint,
tokenizer fingerprint, keys, chat-template settings), so a warm start does no tokenisation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.process.atomic import make_temp
from pipeline.data.errors import DataError
from pipeline.data.token_count import PretokenCounter

__all__ = ["TokenizerHandle", "ArrayCache", "BATCH"]

logger = logging.getLogger(__name__)

# texts per tokenizer batch: large enough for the Rust thread pool, small enough for memory
BATCH = 8192
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
)


class TokenizerHandle:
    """A tokenizer given as a folder path or an object, loaded only when first needed."""

    def __init__(self, tokenizer: Any) -> None:
        self._spec = tokenizer
        self._obj: Any = None if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
        self._fingerprint: str | None = None

    @property
    def obj(self) -> Any:
        """The tokenizer object (loads `AutoTokenizer.from_pretrained(path)` on first use)."""
        if self._obj is None:
            path = os.fspath(self._spec)
            if not Path(path).is_dir():
                raise DataError(
                    f"tokenizer {path!r} is not a folder; pass a local HF tokenizer/model folder "
                    "(holding tokenizer.json) or a tokenizer object"
                )
            from transformers import AutoTokenizer

            try:
                self._obj = AutoTokenizer.from_pretrained(path)
            except Exception as exc:  # noqa: BLE001 - transformers raises many types
                raise DataError(f"tokenizer {path!r} could not be loaded: {exc}") from exc
        return self._obj

    def fingerprint(self) -> str:
        """A hash of what decides token counts and chat rendering (files or serialised state)."""
        if self._fingerprint is None:
            h = hashlib.sha256()
            if self._obj is None:
                folder = Path(os.fspath(self._spec))
                for name in _TOKENIZER_FILES:
                    f = folder / name
                    if f.is_file():
                        h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
            else:
                obj = self._obj
                backend = getattr(obj, "backend_tokenizer", obj)
                if hasattr(backend, "to_str"):
                    h.update(backend.to_str().encode())
                else:
                    h.update(repr(sorted(obj.get_vocab().items())).encode())
                h.update(str(getattr(obj, "chat_template", "")).encode())
                h.update(type(obj).__qualname__.encode())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def render(self, messages: Any, tools: Any, kwargs: dict[str, Any]) -> str:
        """The chat template rendered as text, with the generation prompt (slime's call)."""
        obj = self.obj
        if not hasattr(obj, "apply_chat_template"):
            raise DataError(
                f"apply_chat_template is on but the tokenizer ({type(obj).__name__}) has no "
                "apply_chat_template; pass a HF tokenizer (folder or object) with a chat template"
            )
        return obj.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, **kwargs
        )

    def count(self, texts: Iterable[str]) -> np.ndarray:
        """Token counts (no special tokens) of `texts`, computed in batches."""
        import tokenizers

        out: list[np.ndarray] = []
        folder_json = Path(os.fspath(self._spec)) / "tokenizer.json" if self._obj is None else None
        if folder_json is not None and folder_json.is_file():
            # the Rust tokenizer transformers would wrap; no transformers import needed
            obj: Any = tokenizers.Tokenizer.from_file(str(folder_json))
        else:
            obj = self.obj
        backend = getattr(obj, "backend_tokenizer", None)
        if backend is None and hasattr(obj, "encode_batch") and hasattr(obj, "to_str"):
            backend = obj
        if backend is not None:
            fast = tokenizers.Tokenizer.from_str(backend.to_str())  # private copy
            fast.no_truncation()
            fast.no_padding()
            encode = getattr(fast, "encode_batch_fast", fast.encode_batch)
            counter = PretokenCounter.create(fast)  # exact shortcut for GPT-2-style BPE
            for batch in _batches(texts, BATCH):
                if counter is not None:
                    out.append(counter.count(batch, encode))
                    continue
                encs = encode(batch, add_special_tokens=False)
                out.append(np.fromiter((len(e) for e in encs), dtype=np.int32, count=len(encs)))
        else:
            logger.warning("%s is not a fast tokenizer; counting prompt tokens one by one",
                           type(obj).__name__)
            for batch in _batches(texts, BATCH):
                out.append(np.asarray(
                    [len(obj.encode(t, add_special_tokens=False)) for t in batch], dtype=np.int32))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int32)


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class ArrayCache:
    """`.npz` files of named arrays under `<cache_dir>/<kind>/`, written atomically."""

    def __init__(self, cache_dir: str | os.PathLike | None, kind: str) -> None:
        self.dir = Path(cache_dir) / kind if cache_dir is not None else None

    @staticmethod
    def key(parts: dict[str, Any]) -> str:
        """A stable hash of the JSON-able `parts`."""
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]

    def get(self, key: str) -> dict[str, np.ndarray] | None:
        """The arrays stored under `key`, or None when absent or unreadable."""
        if self.dir is None:
            return None
        f = self.dir / f"{key}.npz"
        if not f.is_file():
            return None
        try:
            with np.load(f, allow_pickle=False) as z:
                return {name: z[name] for name in z.files}
        except (OSError, ValueError) as exc:
            logger.warning("ignoring unreadable cache file %s: %s", f, exc)
            return None

    def put(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        """Store `arrays` under `key` (temp file + rename)."""
        if self.dir is None:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = make_temp(self.dir, suffix=".tmp")
        except OSError as exc:
            logger.warning("cache folder %s is not writable (%s); continuing without caching", self.dir, exc)
            return
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, self.dir / f"{key}.npz")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
