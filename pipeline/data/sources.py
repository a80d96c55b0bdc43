"""Plain and buffered data sources (SPEC §4, §5), slime-compatible.

`get_samples(num_groups)` hands out the next `num_groups` prompts of the epoch order as
groups of `n_samples_per_prompt` fresh samples. Samples are built at fetch time from the
decoded row: no deep copy, yet no mutable object is shared between samples of a group or
with later fetches (each sample gets its own metadata/prompt/label copy).
"""

from __future__ import annotations

import copy
import importlib
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from pipeline.data import checkpoint as ckpt
from pipeline.data.buffer_filters import pop_first
from pipeline.data.dataset import PromptDataset
from pipeline.data.errors import CheckpointError, DataError, DataFingerprintMismatch
from pipeline.data.order import EpochOrder
from pipeline.rollout.contracts import is_sample_like
from pipeline.sample import Sample

__all__ = ["PlainDataSource", "BufferedDataSource"]

logger = logging.getLogger(__name__)

_IMMUTABLE = (str, int, float, bool, type(None))
STATE_FORMAT = "rollout-pipeline/data-source"


def _copies(obj: Any, n: int) -> list[Any]:
    """`n` independent copies of a decoded JSON-like value (the first is `obj` itself)."""
    if isinstance(obj, _IMMUTABLE):
        return [obj] * n
    if isinstance(obj, dict) and all(isinstance(v, _IMMUTABLE) for v in obj.values()):
        return [obj] + [dict(obj) for _ in range(n - 1)]
    try:
        text = json.dumps(obj)
        return [obj] + [json.loads(text) for _ in range(n - 1)]
    except (TypeError, ValueError):  # not JSON (e.g. bytes from parquet)
        return [obj] + [copy.deepcopy(obj) for _ in range(n - 1)]


def _import_path(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise DataError(f"cannot import {dotted!r}: {type(exc).__name__}: {exc}") from exc


class PlainDataSource:
    """Prompts in epoch order as groups of fresh samples; read-only (no buffer)."""

    def __init__(
        self,
        slime_args: Any = None,
        /,
        *,
        path: str | None = None,
        n_samples_per_prompt: int | None = None,
        seed: int = 42,
        shuffle: bool = True,
        input_key: str = "input",
        label_key: str | None = None,
        metadata_key: str | None = "metadata",
        tool_key: str | None = "tools",
        apply_chat_template: bool = False,
        apply_chat_template_kwargs: dict[str, Any] | None = None,
        tokenizer: Any = None,
        max_prompt_len: int | None = None,
        skip_bad_rows: bool = False,
        cache_dir: str | os.PathLike | None = None,
        save_dir: str | os.PathLike | None = None,
        load_dir: str | os.PathLike | None = None,
        keep_checkpoints: int = 3,
        allow_data_change: bool = False,
        args: Any = None,
    ) -> None:
        if slime_args is not None:  # slime style: DataSource(args)
            kwargs = self._kwargs_from_args(slime_args)
            kwargs.pop("buffer_filter_path")
            PlainDataSource.__init__(self, **kwargs, args=slime_args)
            return
        if not path:
            raise DataError("data source: path (slime: prompt_data) is required")
        if isinstance(n_samples_per_prompt, bool) or not isinstance(n_samples_per_prompt, int) \
                or n_samples_per_prompt < 1:
            raise DataError(f"n_samples_per_prompt must be an integer >= 1, got {n_samples_per_prompt!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise DataError(f"seed must be an integer, got {seed!r}")
        if isinstance(keep_checkpoints, bool) or not isinstance(keep_checkpoints, int) or keep_checkpoints < 1:
            raise DataError(f"keep_checkpoints must be an integer >= 1, got {keep_checkpoints!r}")
        self.dataset = PromptDataset(
            path, input_key=input_key, label_key=label_key, metadata_key=metadata_key,
            tool_key=tool_key, apply_chat_template=apply_chat_template,
            apply_chat_template_kwargs=apply_chat_template_kwargs, tokenizer=tokenizer,
            max_prompt_len=max_prompt_len, skip_bad_rows=skip_bad_rows, cache_dir=cache_dir,
        )
        self.n_samples_per_prompt = n_samples_per_prompt
        self.seed, self.shuffle = seed, bool(shuffle)
        self.save_dir = save_dir
        self.load_dir = load_dir
        self.keep_checkpoints = keep_checkpoints
        self.allow_data_change = allow_data_change
        self.args = args if args is not None else SimpleNamespace(
            n_samples_per_prompt=n_samples_per_prompt, rollout_seed=seed, rollout_shuffle=self.shuffle,
            prompt_data=path, reward_key=None)
        self._order = EpochOrder(len(self.dataset), seed, self.shuffle)
        self.epoch_id = 0
        self.sample_offset = 0
        self.sample_group_index = 0
        self.sample_index = 0
        self.current_rollout_id: int | None = None
        # free-form state a rollout function may keep here; saved with the checkpoint (slime)
        self.metadata: dict[str, Any] = {}

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _kwargs_from_args(args: Any) -> dict[str, Any]:
        """Constructor keywords from a slime-style args namespace."""
        get = lambda name, default=None: getattr(args, name, default)  # noqa: E731
        apply_ct = bool(get("apply_chat_template", False))
        max_len = get("rollout_max_prompt_len")
        tokenizer = None
        if apply_ct or max_len is not None:
            tokenizer = get("hf_checkpoint")
            if tokenizer is not None and not Path(str(tokenizer)).is_dir():
                try:
                    from pipeline.engines.assets import resolve_checkpoint
                except ImportError as exc:
                    raise DataError(f"hf_checkpoint {tokenizer!r} is not a folder and cannot be resolved: {exc}") from exc
                tokenizer = resolve_checkpoint(tokenizer, get("cache_dir"))
        kwargs = get("apply_chat_template_kwargs") or {}
        if isinstance(kwargs, str):
            kwargs = json.loads(kwargs)
        save, load = get("save"), get("load")
        return {
            "path": get("prompt_data"), "n_samples_per_prompt": get("n_samples_per_prompt"),
            "seed": get("rollout_seed", 42), "shuffle": bool(get("rollout_shuffle", False)),
            "input_key": get("input_key", "input"), "label_key": get("label_key"),
            "metadata_key": get("metadata_key", "metadata"), "tool_key": get("tool_key", "tools"),
            "apply_chat_template": apply_ct, "apply_chat_template_kwargs": dict(kwargs),
            "tokenizer": tokenizer, "max_prompt_len": max_len,
            "save_dir": os.path.join(save, "rollout") if save else None,
            "load_dir": os.path.join(load, "rollout") if load else None,
            "buffer_filter_path": get("buffer_filter_path"),
        }

    @classmethod
    def from_args(cls, args: Any, **overrides: Any) -> PlainDataSource:
        """Build from slime's names (prompt_data, rollout_seed, rollout_shuffle, input_key, ...)."""
        kwargs = cls._kwargs_from_args(args)
        filter_path = kwargs.pop("buffer_filter_path")
        if issubclass(cls, BufferedDataSource) and filter_path:
            kwargs["buffer_filter"] = filter_path
        kwargs.update(overrides)
        return cls(**kwargs, args=args)

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self.dataset)

    def begin_rollout(self, rollout_id: int) -> None:
        """Called by the runner before each rollout; buffer filters get this id."""
        self.current_rollout_id = rollout_id

    def _next_rows(self, num: int) -> np.ndarray:
        """Next `num` prompt positions of the epoch order, crossing epochs as often as needed."""
        parts = []
        while num > 0:
            order = self._order.order(self.epoch_id)
            end = self.sample_offset + num
            if end <= len(order):
                parts.append(order[self.sample_offset:end])
                self.sample_offset, num = end, 0
            else:
                parts.append(order[self.sample_offset:])
                num -= len(order) - self.sample_offset
                self.epoch_id += 1
                self.sample_offset = 0
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def _groups(self, ks: np.ndarray) -> list[list[Sample]]:
        """Fresh groups for kept-prompt positions `ks`; advances the global counters."""
        n = self.n_samples_per_prompt
        out = []
        gi, idx = self.sample_group_index, self.sample_index
        for prompt, label, meta in self.dataset.fields_many(ks):
            prompts, labels, metas = _copies(prompt, n), _copies(label, n), _copies(meta, n)
            out.append([Sample(group_index=gi, index=idx + j, prompt=prompts[j], label=labels[j],
                               metadata=metas[j]) for j in range(n)])
            gi += 1
            idx += n
        self.sample_group_index, self.sample_index = gi, idx
        return out

    def _check_num(self, num_groups: Any) -> int:
        if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or num_groups < 0:
            raise DataError(f"get_samples: num_groups must be a non-negative integer, got {num_groups!r}")
        return int(num_groups)

    def get_samples(self, num_groups: int, rollout_id: int | None = None) -> list[list[Sample]]:
        """The next `num_groups` prompts as groups of `n_samples_per_prompt` fresh samples."""
        num_groups = self._check_num(num_groups)
        return self._groups(self._next_rows(num_groups))

    def add_samples(self, groups: list[list[Sample]]) -> None:
        """The plain source has no buffer."""
        raise TypeError(
            "PlainDataSource is read-only: add_samples needs a buffer; use "
            "pipeline.BufferedDataSource (data_source=buffered)"
        )

    def get_buffer_length(self) -> int:
        """Number of buffered groups (always 0 here)."""
        return 0

    # ------------------------------------------------------------------ state
    def fingerprint(self) -> dict[str, Any]:
        """Data fingerprint plus the settings that decide the order and group shape."""
        return {**self.dataset.fingerprint(), "n_samples_per_prompt": self.n_samples_per_prompt,
                "seed": self.seed, "shuffle": self.shuffle}

    def state_dict(self) -> dict[str, Any]:
        """The whole state as JSON-able data."""
        return {
            "format": STATE_FORMAT, "class": type(self).__name__, "fingerprint": self.fingerprint(),
            "epoch_id": self.epoch_id, "sample_offset": self.sample_offset,
            "sample_group_index": self.sample_group_index, "sample_index": self.sample_index,
            "current_rollout_id": self.current_rollout_id, "metadata": self.metadata,
        }

    def load_state_dict(self, state: dict[str, Any], *, source: str = "state", copy_state: bool = True) -> None:
        """Restore `state_dict()`; refuses a fingerprint mismatch unless allow_data_change.

        The state is copied first (a JSON round trip) so the restored source shares no
        mutable object with the caller's dict; `load()` skips that for freshly read files.
        """
        if copy_state:
            state = json.loads(json.dumps(state))
        if state.get("format") != STATE_FORMAT:
            raise CheckpointError(f"{source}: not a data-source state (format {state.get('format')!r})")
        diffs = ckpt.diff_fingerprints(state["fingerprint"], self.fingerprint())
        if diffs:
            msg = f"{source} was written for different data: " + "; ".join(diffs)
            if not self.allow_data_change:
                raise DataFingerprintMismatch(msg + ". Pass allow_data_change=true to load it anyway.")
            logger.warning("%s (allow_data_change is set; loading anyway)", msg)
        self.epoch_id = int(state["epoch_id"])
        self.sample_offset = min(int(state["sample_offset"]), len(self.dataset))
        self.sample_group_index = int(state["sample_group_index"])
        self.sample_index = int(state["sample_index"])
        self.current_rollout_id = state.get("current_rollout_id")
        self.metadata = dict(state.get("metadata") or {})

    def save(self, rollout_id: int) -> Path:
        """Write `<save_dir>/rollout_<id>.json` atomically and keep the newest `keep_checkpoints`."""
        if self.save_dir is None:
            raise CheckpointError("save: no save_dir configured for the data source")
        path = ckpt.checkpoint_path(self.save_dir, rollout_id)
        ckpt.write_checkpoint(path, {**self.state_dict(), "rollout_id": int(rollout_id)})
        ckpt.prune_checkpoints(self.save_dir, self.keep_checkpoints)
        logger.info("saved data-source state to %s", path)
        return path

    def load(self, rollout_id: int | None = None) -> int | None:
        """Load checkpoint `rollout_id`, or the newest valid one when None; returns its id.

        Returns None when there is nothing to load. A truncated or corrupt file is skipped with
        a warning when searching for the newest; an explicitly requested one raises.
        A slime `global_dataset_state_dict_<id>.pt` in the same folder is read as well.
        """
        directory = self.load_dir or self.save_dir
        if directory is None:
            return None
        if rollout_id is not None:
            path = ckpt.checkpoint_path(directory, rollout_id)
            if path.is_file():
                self.load_state_dict(ckpt.read_checkpoint(path), source=str(path), copy_state=False)
                return int(rollout_id)
            slime = Path(directory) / f"global_dataset_state_dict_{int(rollout_id)}.pt"
            if slime.is_file():
                self._load_slime(slime)
                return int(rollout_id)
            logger.info("no data-source checkpoint %s; starting fresh", path)
            return None
        for rid, path in reversed(ckpt.list_checkpoints(directory)):
            try:
                state = ckpt.read_checkpoint(path)
            except CheckpointError as exc:
                logger.warning("skipping invalid checkpoint: %s", exc)
                continue
            self.load_state_dict(state, source=str(path), copy_state=False)
            return rid
        return None

    def _load_slime(self, path: Path) -> None:
        state = ckpt.read_slime_state(path)
        self.epoch_id = int(state["epoch_id"])
        self.sample_offset = min(int(state["sample_offset"]), len(self.dataset))
        self.sample_group_index = int(state["sample_group_index"])
        self.sample_index = int(state["sample_index"])
        self.metadata = dict(state.get("metadata") or {})
        logger.info("loaded slime data-source state %s (slime saves no buffer)", path)


class BufferedDataSource(PlainDataSource):
    """A data source with a buffer of groups that the buffer filter serves first."""

    def __init__(self, slime_args: Any = None, /, *, buffer_filter: Callable[..., Any] | str | None = None,
                 **kwargs: Any) -> None:
        if slime_args is not None and buffer_filter is None:
            buffer_filter = getattr(slime_args, "buffer_filter_path", None)
        super().__init__(slime_args, **kwargs)
        if isinstance(buffer_filter, str):
            buffer_filter = _import_path(buffer_filter)
            if isinstance(buffer_filter, type):  # a stateful filter class: default instance
                buffer_filter = buffer_filter()
        if buffer_filter is not None and not callable(buffer_filter):
            raise DataError(f"buffer_filter must be callable (args, rollout_id, buffer, num_samples), got {buffer_filter!r}")
        self.buffer_filter = buffer_filter or pop_first
        self.buffer: list[list[Any]] = []

    def get_samples(self, num_groups: int, rollout_id: int | None = None) -> list[list[Any]]:
        """Groups from the buffer filter first, topped up from the dataset."""
        num_groups = self._check_num(num_groups)
        rid = rollout_id if rollout_id is not None else self.current_rollout_id
        groups: list[list[Any]] = []
        if self.buffer and num_groups:
            name = getattr(self.buffer_filter, "__qualname__", type(self.buffer_filter).__qualname__)
            got = self.buffer_filter(self.args, rid, self.buffer, num_groups)
            if not isinstance(got, list) or any(not isinstance(g, list) for g in got):
                raise DataError(f"buffer filter {name} must return a list of groups (lists), got {type(got).__name__}")
            if len(got) > num_groups:
                raise DataError(f"buffer filter {name} returned {len(got)} groups for a request of {num_groups}")
            groups = got
        if len(groups) < num_groups:
            groups = groups + super().get_samples(num_groups - len(groups))
        return groups

    def add_samples(self, groups: list[list[Any]]) -> None:
        """Append groups to the buffer; each must hold exactly n_samples_per_prompt samples."""
        if not isinstance(groups, list):
            raise DataError(f"add_samples expects a list of groups (lists of Samples), got {type(groups).__name__}")
        n = self.n_samples_per_prompt
        for gi, group in enumerate(groups):
            if not isinstance(group, list):
                raise DataError(f"add_samples: item {gi} is a {type(group).__name__}, expected a group (list of Samples)")
            if len(group) != n:
                raise DataError(f"add_samples: group {gi} has {len(group)} samples, expected n_samples_per_prompt={n}")
            for si, s in enumerate(group):
                if not is_sample_like(s):
                    raise DataError(f"add_samples: group {gi} item {si} is a {type(s).__name__}, expected a Sample")
        self.buffer.extend(list(g) for g in groups)

    def get_buffer_length(self) -> int:
        """Number of buffered groups."""
        return len(self.buffer)

    def state_dict(self) -> dict[str, Any]:
        """Plain state plus every buffered sample in full and the filter's state."""
        state = super().state_dict()
        state["buffer"] = ckpt.encode_groups(self.buffer)
        state["buffer_filter"] = self.buffer_filter.state_dict() if hasattr(self.buffer_filter, "state_dict") else None
        return state

    def load_state_dict(self, state: dict[str, Any], *, source: str = "state", copy_state: bool = True) -> None:
        """Restore counters, the buffer and the filter's state."""
        if copy_state:
            state = json.loads(json.dumps(state))
        super().load_state_dict(state, source=source, copy_state=False)
        self.buffer = ckpt.decode_groups(state["buffer"]) if state.get("buffer") else []
        if state.get("buffer_filter") is not None and hasattr(self.buffer_filter, "load_state_dict"):
            self.buffer_filter.load_state_dict(state["buffer_filter"])
