"""Plain and buffered data sources (docs/contracts.md §4, §5), slime-compatible.

`get_samples(num_samples)` hands out the next `num_samples` prompts of the epoch order as
groups of `n_samples_per_prompt` fresh samples (slime's name: the count is of groups). Samples
are built at fetch time from the decoded row: no deep copy, yet no mutable object is shared
between samples of a group or with later fetches (each sample gets its own metadata/prompt/label
copy). Without a prompt file the buffered source is buffer-only (slime's
`--disable-rollout-global-dataset`): add_samples fills it, and a short buffer is topped up with
empty samples for the rollout function to fill, as slime does.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from pipeline.data import checkpoint as ckpt
from pipeline.data.buffer_filters import REMOVE_HINT, left_in_buffer, pop_first
from pipeline.data.dataset import PromptDataset
from pipeline.data.errors import DataError
from pipeline.data.lengths import ArrayCache
from pipeline.data.order import EpochOrder
from pipeline.data.persistence import CheckpointMixin
from pipeline.data.sample_codec import json_default
from pipeline.slime.args import import_path, kwargs_from_args, tokenizer_from_args
from pipeline.rollout.contracts import is_sample_like
from pipeline.samples.sample import Sample

__all__ = ["PlainDataSource", "BufferedDataSource", "prompt_groups"]

logger = logging.getLogger(__name__)

_IMMUTABLE = (str, int, float, bool, type(None))
_IMMUTABLE_TYPES = frozenset(_IMMUTABLE)


# fields whose default is a fresh container (tokens, weight_versions, metadata, ...)
_FRESH_FIELDS = frozenset(f.name for f in dataclasses.fields(Sample)
                          if f.default_factory is not dataclasses.MISSING)
# `_groups` fills a copy of the default `__dict__` directly when `Sample.__init__` only sets
# fields and the fresh containers are the ones it replaces; otherwise it calls `Sample(...)`
_FAST_INIT = _FRESH_FIELDS == {"tokens", "apply_chat_template_kwargs", "weight_versions", "metadata"} \
    and not hasattr(Sample, "__post_init__")
_TEMPLATE = dict(Sample().__dict__)


def _slime_form(args: Any, prompt_data: Any, n_samples_per_prompt: Any) -> bool:
    """Whether a source is built slime's way: `cls(args)` or `cls(args=args)`, args alone (with
    prompt_data or n_samples_per_prompt given it is our keyword form, and args is what buffer
    filters receive)."""
    return args is not None and prompt_data is None and n_samples_per_prompt is None


def _copies(obj: Any, n: int) -> list[Any]:
    """`n` independent copies of a decoded JSON-like value (the first is `obj` itself)."""
    cls = obj.__class__
    if cls is str or obj is None or cls in _IMMUTABLE_TYPES:
        return [obj] * n
    if cls is dict and set(map(type, obj.values())) <= _IMMUTABLE_TYPES:
        return [obj, *map(dict.copy, [obj] * (n - 1))]
    try:
        text = json.dumps(obj)
        copies = [json.loads(text) for _ in range(n - 1)]
        if not copies or copies[0] == obj:  # a round trip that changes the value (tuples, int keys) is no copy
            return [obj] + copies
    except (TypeError, ValueError):  # not JSON (e.g. bytes from parquet)
        pass
    return [obj] + [copy.deepcopy(obj) for _ in range(n - 1)]


def prompt_groups(dataset: PromptDataset, ks: np.ndarray, n: int, first_group: int = 0,
                  first_index: int = 0) -> list[list[Sample]]:
    """Groups of `n` fresh samples for the prompts at positions `ks` of `dataset`, numbered from
    `first_group` (group_index) and `first_index` (index).

    Samples are built from a template of the immutable defaults (`object.__new__` plus a
    fresh `__dict__`, as `Sample(...)` would set it), each with its own default containers
    and its own prompt/label/metadata copy.
    """
    gi, idx = first_group, first_index
    fields = dataset.fields_many(ks)
    if not _FAST_INIT:
        out = []
        for k, (prompt, label, meta) in enumerate(fields):
            prompts, labels, metas = _copies(prompt, n), _copies(label, n), _copies(meta, n)
            out.append([Sample(group_index=gi + k, index=idx + k * n + j, prompt=prompts[j],
                               label=labels[j], metadata=metas[j]) for j in range(n)])
        return out
    template, new, out = _TEMPLATE, object.__new__, []
    for k, (prompt, label, meta) in enumerate(fields):
        prompts, labels, metas = _copies(prompt, n), _copies(label, n), _copies(meta, n)
        group, first = [], idx + k * n
        for j in range(n):
            d = template.copy()
            d["group_index"], d["index"] = gi + k, first + j
            d["prompt"], d["label"], d["metadata"] = prompts[j], labels[j], metas[j]
            d["tokens"], d["weight_versions"], d["apply_chat_template_kwargs"] = [], [], {}
            sample = new(Sample)
            sample.__dict__ = d
            group.append(sample)
        out.append(group)
    return out


class PlainDataSource(CheckpointMixin):
    """Prompts in epoch order as groups of fresh samples; read-only (no buffer).

    Build it from keywords (Hydra: `conf/data_source/plain.yaml`) or, as slime's RolloutManager
    builds `--data-source-path`, from a slime args namespace alone: `PlainDataSource(args)`,
    `PlainDataSource(args=args)` (args given, neither prompt_data nor n_samples_per_prompt) or
    `PlainDataSource.from_args(args)`; the first parameter is `args`, as in slime's
    `DataSource.__init__(self, args)`. Then `tokenizer`, `save_dir` and `load_dir` keywords still
    apply, and `args.save` / `args.load` give `<save>/rollout` / `<load>/rollout`.
    `prompt_data` (the prompt file, slime's name; `file@[a:b]` slices allowed), the keys and
    `max_prompt_len` define the prompts (see `PromptDataset`); `seed`/`shuffle` the epoch order (docs/contracts.md §3); `save_dir`/`load_dir`,
    `keep_checkpoints` and `allow_data_change` the checkpoints (docs/contracts.md §5). `tokenizer` is a HF
    tokenizer folder or object; without one, `args.hf_checkpoint` is used when needed.
    `args` is what buffer filters receive (a slime-named namespace is made when absent).
    The keyword defaults are `conf/data_source/plain.yaml`'s (a slime-form build reads args instead).
    """

    buffer_only_ok = False  # the plain source needs a prompt file

    # capabilities the pre-flight check reads (`pipeline.config.plugins`): no buffer of groups
    plugin_provides: frozenset[str] = frozenset()

    def __init__(
        self,
        args: Any = None,
        *,
        prompt_data: str | None = None,
        n_samples_per_prompt: int | None = None,
        seed: int = 42,
        shuffle: bool = True,
        input_key: str = "input",
        label_key: str | None = "label",
        metadata_key: str | None = "metadata",
        tool_key: str | None = "tools",
        apply_chat_template: bool = True,
        apply_chat_template_kwargs: dict[str, Any] | None = None,
        tokenizer: Any = None,
        max_prompt_len: int | None = None,
        skip_bad_rows: bool = False,
        cache_dir: str | os.PathLike | None = None,
        save_dir: str | os.PathLike | None = None,
        load_dir: str | os.PathLike | None = None,
        keep_checkpoints: int = 3,
        allow_data_change: bool = False,
    ) -> None:
        if _slime_form(args, prompt_data, n_samples_per_prompt):  # slime style: DataSource(args) / (args=args)
            kwargs = kwargs_from_args(args)
            kwargs.pop("buffer_filter_path")
            if kwargs["n_samples_per_prompt"] is None:
                raise DataError("data source built from args alone: args has no n_samples_per_prompt "
                                "(slime's --n-samples-per-prompt), expected an integer >= 1")
            given = {"tokenizer": tokenizer, "save_dir": save_dir, "load_dir": load_dir}
            kwargs.update({k: v for k, v in given.items() if v is not None})
            PlainDataSource.__init__(self, args, **kwargs)
            return
        if not prompt_data and not self.buffer_only_ok:
            raise DataError("data source: prompt_data is required; without a prompt file use "
                            "the buffered source (data_source=buffered data_source.prompt_data=null: buffer-only, "
                            "slime's --disable-rollout-global-dataset)")
        if isinstance(n_samples_per_prompt, bool) or not isinstance(n_samples_per_prompt, int) \
                or n_samples_per_prompt < 1:
            raise DataError(f"n_samples_per_prompt must be an integer >= 1, got {n_samples_per_prompt!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise DataError(f"seed must be an integer, got {seed!r}")
        if isinstance(keep_checkpoints, bool) or not isinstance(keep_checkpoints, int) or keep_checkpoints < 1:
            raise DataError(f"keep_checkpoints must be an integer >= 1, got {keep_checkpoints!r}")
        if tokenizer is None and (apply_chat_template or max_prompt_len is not None) and args is not None:
            tokenizer = tokenizer_from_args(args)  # no engine tokenizer injected: use hf_checkpoint
        # None: buffer-only (no prompt file)
        self.dataset: PromptDataset | None = PromptDataset(
            prompt_data, input_key=input_key, label_key=label_key, metadata_key=metadata_key,
            tool_key=tool_key, apply_chat_template=apply_chat_template,
            apply_chat_template_kwargs=apply_chat_template_kwargs, tokenizer=tokenizer,
            max_prompt_len=max_prompt_len, skip_bad_rows=skip_bad_rows, cache_dir=cache_dir,
        ) if prompt_data else None
        self.n_samples_per_prompt = n_samples_per_prompt
        self.seed, self.shuffle = seed, bool(shuffle)
        self.save_dir = save_dir
        self.load_dir = load_dir
        self.keep_checkpoints = keep_checkpoints
        self.allow_data_change = allow_data_change
        self.args = args if args is not None else SimpleNamespace(
            n_samples_per_prompt=n_samples_per_prompt, rollout_seed=seed, rollout_shuffle=self.shuffle,
            prompt_data=prompt_data, reward_key=None)
        self._order = EpochOrder(len(self), seed, self.shuffle, ArrayCache(cache_dir, "epoch_order")) \
            if self.dataset is not None else None
        self.epoch_id = 0
        self.sample_offset = 0
        self.sample_group_index = 0
        self.sample_index = 0
        self.current_rollout_id: int | None = None
        # free-form state a rollout function may keep here; saved with the checkpoint (slime)
        self.metadata: dict[str, Any] = {}
        # a request larger than the dataset was logged (once per source)
        self._wrap_noted = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_args(cls, args: Any, **overrides: Any) -> PlainDataSource:
        """Build from slime's names (prompt_data, rollout_seed, rollout_shuffle, input_key, ...)."""
        kwargs = kwargs_from_args(args)
        filter_path = kwargs.pop("buffer_filter_path")
        if issubclass(cls, BufferedDataSource) and filter_path:
            kwargs["buffer_filter"] = filter_path
        kwargs.update(overrides)
        return cls(**kwargs, args=args)

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        """Number of prompts (0 for a buffer-only source, as slime)."""
        return len(self.dataset) if self.dataset is not None else 0

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """slime: merge `metadata` into the free-form state saved with checkpoints."""
        self.metadata.update(metadata)

    def get_metadata(self) -> dict[str, Any]:
        """slime: the free-form state saved with checkpoints."""
        return self.metadata

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
        out = prompt_groups(self.dataset, ks, self.n_samples_per_prompt, self.sample_group_index, self.sample_index)
        self.sample_group_index += len(out)
        self.sample_index += len(out) * self.n_samples_per_prompt
        return out

    def _check_num(self, num_groups: Any) -> int:
        if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or num_groups < 0:
            raise DataError(f"get_samples: num_groups must be a non-negative integer, got {num_groups!r}")
        return int(num_groups)

    def get_samples(self, num_samples: int, rollout_id: int | None = None) -> list[list[Sample]]:
        """The next `num_samples` prompts as groups of `n_samples_per_prompt` fresh samples
        (buffer-only: empty samples with fresh group and sample indices)."""
        num_samples = self._check_num(num_samples)
        if self.dataset is None:
            return self._empty_groups(num_samples)
        if num_samples > len(self.dataset) and not self._wrap_noted:
            self._wrap_noted = True
            logger.warning(
                "%s: a request for %d groups is larger than the dataset (%d prompts): the epoch wraps "
                "inside one batch, so the same prompts appear more than once in it (noted once; lower "
                "rollout_batch_size / over_sampling_batch_size or add prompts)",
                self.dataset.path, num_samples, len(self.dataset))
        return self._groups(self._next_rows(num_samples))

    def _empty_groups(self, num: int) -> list[list[Sample]]:
        """`num` groups of fresh default samples; advances the global counters."""
        n, gi, idx = self.n_samples_per_prompt, self.sample_group_index, self.sample_index
        out = [[Sample(group_index=gi + k, index=idx + k * n + j) for j in range(n)] for k in range(num)]
        self.sample_group_index, self.sample_index = gi + num, idx + num * n
        return out

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """The plain source has no buffer."""
        raise TypeError(
            "PlainDataSource is read-only: add_samples needs a buffer; use "
            "pipeline.BufferedDataSource (data_source=buffered)"
        )

    def get_buffer_length(self) -> int:
        """Number of buffered groups (always 0 here)."""
        return 0

    def metrics(self) -> dict[str, float]:
        """Gauges for the run log: buffer size, epoch, skipped/too-long rows, filter counters."""
        ds = self.dataset
        out = {"buffer/size": float(self.get_buffer_length()), "data/epoch": float(self.epoch_id),
               "data/skipped_rows": float(ds.skipped_rows if ds is not None else 0),
               "data/too_long_prompts": float(ds.too_long if ds is not None else 0)}
        filt = getattr(self, "buffer_filter", None)
        if hasattr(filt, "metrics"):
            out.update(filt.metrics())
        return out


class BufferedDataSource(PlainDataSource):
    """A data source with a buffer of groups that the buffer filter serves first.

    Without `prompt_data` (unset, or slime's `rollout_global_dataset=False`) it is
    buffer-only: no prompt file, groups come from `add_samples`, and when the buffer runs short
    `get_samples` tops up with empty samples (fresh indices) for the rollout function to fill.
    Its checkpoints hold the buffer as well (slime saves nothing in that mode).
    """

    buffer_only_ok = True
    plugin_provides: frozenset[str] = frozenset({"buffer"})

    def __init__(self, args: Any = None, *, buffer_filter: Callable[..., Any] | str | None = None,
                 **kwargs: Any) -> None:
        slime_form = _slime_form(args, kwargs.get("prompt_data"), kwargs.get("n_samples_per_prompt"))
        if slime_form and buffer_filter is None:
            buffer_filter = getattr(args, "buffer_filter_path", None)
        super().__init__(args, **kwargs)
        if isinstance(buffer_filter, str):  # inside the allowlist a slime-form args carries
            buffer_filter = import_path(buffer_filter, args if slime_form else None)
            if isinstance(buffer_filter, type):  # a stateful filter class: default instance
                buffer_filter = buffer_filter()
        if buffer_filter is not None and not callable(buffer_filter):
            raise DataError(f"buffer_filter must be callable (args, rollout_id, buffer, num_samples), got {buffer_filter!r}")
        self.buffer_filter = buffer_filter or pop_first
        self.buffer: list[list[Any]] = []
        # samples the filter handed out without removing them from the buffer, by id (the objects are
        # kept, so an id is not reused while recorded): handing one out again is an error
        self._served_in_buffer: dict[int, Any] = {}

    def get_samples(self, num_samples: int, rollout_id: int | None = None) -> list[list[Any]]:
        """Groups from the buffer filter first, topped up from the dataset (or with empty samples)."""
        num_groups = self._check_num(num_samples)
        rid = rollout_id if rollout_id is not None else self.current_rollout_id
        groups: list[list[Any]] = []
        if self.buffer and num_groups:
            name = getattr(self.buffer_filter, "__qualname__", type(self.buffer_filter).__qualname__)
            got = self.buffer_filter(self.args, rid, self.buffer, num_groups)
            if not isinstance(got, list) or any(not isinstance(g, list) for g in got):
                raise DataError(f"buffer filter {name} must return a list of groups (lists), got {type(got).__name__}")
            if len(got) > num_groups:
                raise DataError(f"buffer filter {name} returned {len(got)} groups for a request of {num_groups}")
            self._check_removed(got, rid)
            groups = got
        if len(groups) < num_groups:
            groups = groups + super().get_samples(num_groups - len(groups))
        return groups

    def _check_removed(self, got: list[list[Any]], rollout_id: int | None) -> None:
        """Warn when the filter returned groups without removing them from the buffer; raise
        DataError when it hands out such a group again while it is still there."""
        kept = left_in_buffer(got, self.buffer)
        if not kept and not self._served_in_buffer:
            return  # the filter keeps the contract
        buffered = {id(s) for group in self.buffer for s in group}
        # a sample that left the buffer since is forgotten (add_samples may bring it back to be served again)
        served = {k: s for k, s in self._served_in_buffer.items() if k in buffered}
        f = self.buffer_filter
        name = ".".join(filter(None, (getattr(f, "__module__", None) or type(f).__module__,
                                      getattr(f, "__qualname__", None) or type(f).__qualname__)))
        for group in kept:
            if any(served.get(id(s)) is s for s in group):
                first = group[0] if group else None
                raise DataError(
                    f"buffer filter {name} handed out group {getattr(first, 'group_index', None)} (sample indices "
                    f"{[getattr(s, 'index', None) for s in group]}) again in rollout {rollout_id} while it is still "
                    f"in the buffer: {REMOVE_HINT}")
        if kept:
            logger.warning("buffer filter %s returned %d groups in rollout %s but did not remove them from the buffer "
                           "(groups %s); handing one out again fails: %s", name, len(kept), rollout_id,
                           [getattr(g[0], "group_index", None) for g in kept if g], REMOVE_HINT)
        served.update((id(s), s) for group in kept for s in group)
        self._served_in_buffer = served

    def add_samples(self, samples: list[list[Any]]) -> None:
        """Append groups to the buffer; each must hold exactly n_samples_per_prompt samples."""
        groups = samples
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
        return self._state(raw=False)

    def _checkpoint_state(self) -> dict[str, Any]:
        """`state_dict()` with the buffer's packed columns as numpy arrays (stored raw)."""
        return self._state(raw=True)

    def _state(self, raw: bool) -> dict[str, Any]:
        state = super().state_dict()
        state["buffer"] = ckpt.encode_groups(self.buffer, raw=raw)
        state["buffer_filter"] = self.buffer_filter.state_dict() if hasattr(self.buffer_filter, "state_dict") else None
        return state

    def load_state_dict(self, state: dict[str, Any], *, source: str = "state", copy_state: bool = True) -> None:
        """Restore counters, the buffer and the filter's state."""
        if copy_state:
            state = json.loads(json.dumps(state, default=json_default))
        super().load_state_dict(state, source=source, copy_state=False)
        self.buffer = ckpt.decode_groups(state["buffer"]) if state.get("buffer") else []
        self._served_in_buffer = {}
        if state.get("buffer_filter") is not None and hasattr(self.buffer_filter, "load_state_dict"):
            self.buffer_filter.load_state_dict(state["buffer_filter"])
