"""Lossless, fast encoding of groups of samples (the buffer in a checkpoint).

Samples are stored column-wise: the numeric per-token lists (tokens, loss_mask,
rollout_log_probs) as one concatenated array per field plus a lengths array, in the smallest
exact dtype (else plain JSON lists); a column of all-1 int lists (loss masks) as its lengths
only, a column of bit-identical lists as one row, a prompt shared by a group's token lists once
per group. String fields interned, int fields as
arrays, constant fields once, dicts with the same keys (metadata) one column per key, every
other field as one JSON list, extra attributes per sample. Arrays are base64 text in the
JSON-able form (`state_dict`) and numpy arrays with `raw=True` (stored as raw bytes by
`checkpoint`). Decoding converts each array with one `.tolist()` and builds fresh `Sample` objects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import operator
from collections.abc import Iterator
from itertools import chain, repeat
from typing import Any

import numpy as np

from pipeline.data.column_codec import (decode_array, decode_column, encode_array, encode_column, json_default, pack_b64,
                                        pack_raw)
from pipeline.data.errors import CheckpointError
from pipeline.samples.sample import Sample
from pipeline.samples.meta import coerce_status

__all__ = ["encode_groups", "decode_groups", "gc_paused", "json_default"]


@contextlib.contextmanager
def gc_paused(promote: bool = False) -> Iterator[None]:
    """Pause the cyclic GC (re-entrant): building millions of small objects would otherwise
    trigger generational passes over the whole heap again and again.

    With `promote`, the outermost pause ends by moving every tracked object into the oldest
    generation (`gc.freeze()` + `gc.unfreeze()`, a list splice): the objects just built are
    long-lived (a decoded buffer), and re-enabling the GC would otherwise traverse them three
    times in a row (young, middle, then a full pass). Skipped when something else has frozen
    objects, so their freeze is left alone.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            if promote and gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


_ARRAYS = {"tokens": int, "loss_mask": int, "rollout_log_probs": float, "rollout_top_p_token_ids": int,
           "rollout_top_p_token_offsets": int, "teacher_log_probs": float}
_FIELDS = tuple(f for f in Sample.__dataclass_fields__ if f not in _ARRAYS)
# fields holding a record object (None: not made yet), stored as their dicts
_RECORDS = {"spec_info": Sample.SpecInfo, "prefix_cache_info": Sample.PrefixCacheInfo}
# fields a plugin may fill with tensors / arrays: stored as (nested) lists
_LISTLIKE = frozenset(_ARRAYS) | {"rollout_routed_experts"}


def _plain(value: Any) -> Any:
    """A tensor / numpy array as (nested) lists; anything else as it is."""
    return value.tolist() if hasattr(value, "tolist") and not isinstance(value, (list, str)) else value


def _record_dict(value: Any) -> Any:
    """A record (or the dict a foreign sample gives) as a dict; None stays None."""
    return value if value is None or isinstance(value, dict) else value.to_dict()


def _default(name: str) -> Any:
    """A zero-argument factory for the default of Sample field `name` (for foreign samples)."""
    f = Sample.__dataclass_fields__[name]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory
    return lambda: f.default


def _sample_dict(s: Any) -> dict[str, Any]:
    d = dict(s.__dict__) if isinstance(s, Sample) else dict(s.to_dict() if hasattr(s, "to_dict") else vars(s))
    d["status"] = coerce_status(d.get("status", Sample.Status.PENDING)).value
    return d


def _column(dicts: list[dict[str, Any]], name: str, default: Any) -> list[Any]:
    """`d[name]` of every dict (C-level map), `default()` where a foreign sample lacks it."""
    try:
        return list(map(operator.itemgetter(name), dicts))
    except KeyError:
        return [d[name] if name in d else default() for d in dicts]


_ALL = tuple(_ARRAYS) + _FIELDS
_GET_ALL = operator.itemgetter(*_ALL)


def encode_groups(groups: list[list[Any]], raw: bool = False) -> dict[str, Any]:
    """JSON-able, lossless encoding of groups of samples (ours or slime's).

    With `raw`, the packed columns are numpy arrays instead of base64 text (for
    `checkpoint.write_checkpoint`, which stores them as raw bytes).
    """
    pack = pack_raw if raw else pack_b64
    with gc_paused():
        samples = list(chain.from_iterable(groups))
        if set(map(type, samples)) <= {Sample}:
            dicts = list(map(vars, samples))
        else:
            dicts = [s.__dict__ if type(s) is Sample else _sample_dict(s) for s in samples]
        out: dict[str, Any] = {"group_sizes": list(map(len, groups)), "columns": {}, "arrays": {}}
        try:  # one pass over the dicts (each is touched once), then strided slices
            flat = list(chain.from_iterable(map(_GET_ALL, dicts)))
            columns = {name: flat[k::len(_ALL)] for k, name in enumerate(_ALL)} if dicts else {}
            del flat
        except KeyError:  # a foreign sample lacks a field: its default
            columns = {}
        if not columns:
            columns = {name: _column(dicts, name, (lambda: None) if name in _ARRAYS else _default(name))
                       for name in _ALL}
        unset = {name for name in (*_LISTLIKE, *_RECORDS) if not any(map(operator.is_not, columns[name], repeat(None)))}
        for name in _LISTLIKE - unset:
            if not set(map(type, columns[name])) <= {list, type(None)}:
                columns[name] = list(map(_plain, columns[name]))
        for name in _RECORDS.keys() - unset:
            columns[name] = list(map(_record_dict, columns[name]))
        for name, kind in _ARRAYS.items():
            values = columns[name]
            if name in unset:  # no sample has one (top-p replay off, no teacher): one constant
                out["columns"][name] = {"const": None}
                continue
            enc = encode_array(values, kind, pack, (out["group_sizes"], columns["response_length"])
                                if name == "tokens" else None)
            if enc is None:
                out["columns"][name] = {"values": values}
            else:
                out["arrays"][name] = enc
        for name in _FIELDS:
            values = columns[name]
            if name == "status":  # a Status is a str: the table maps members and strings
                values = list(map(_STATUS_VALUE.get, values, values))
            out["columns"][name] = encode_column(values, pack)
        fields = Sample.__dataclass_fields__
        # a Sample's dict holds exactly its fields unless it carries extra attributes
        odd = np.flatnonzero(np.fromiter(map(len, dicts), np.int64, len(dicts)) != len(fields)).tolist()
        extras = [[i, {k: v for k, v in dicts[i].items() if k not in fields}] for i in odd]
        out["extras"] = [e for e in extras if e[1]]
        return out


_STATUS = {s.value: s for s in Sample.Status}
_STATUS_VALUE = {s: s.value for s in Sample.Status}
_POSITION = {name: i for i, name in enumerate(Sample.__dataclass_fields__)}


def _missing_fields(base: dict[str, Any]) -> list[tuple[str, Any]]:
    """Give `base` the defaults of the fields an older checkpoint lacks; returns (name, factory)
    of those whose default is a fresh container (filled per sample)."""
    fresh = []
    for name, f in Sample.__dataclass_fields__.items():
        if name not in base:
            base[name] = None if f.default_factory is not dataclasses.MISSING else f.default
            if f.default_factory is not dataclasses.MISSING:
                fresh.append((name, f.default_factory))
    return fresh


def decode_groups(enc: dict[str, Any]) -> list[list[Sample]]:
    """Inverse of `encode_groups`: fresh `Sample` objects, extra attributes restored."""
    with gc_paused(promote=True):
        sizes = enc["group_sizes"]
        total = sum(sizes)
        # constant columns go into a template dict (in field order); each row is a copy of
        # it updated with its own values of the other columns
        base: dict[str, Any] = {}
        columns: dict[str, list[Any]] = {}
        for name, col in enc["columns"].items():
            if "const" in col:
                base[name] = col["const"]
            else:
                base[name] = None
                columns[name] = decode_column(col, total)
        for name, arr in enc["arrays"].items():
            base[name] = None
            columns[name] = decode_array(arr, sizes)
        for name in _RECORDS:  # a record object per sample (a column of None: never made)
            if name in columns:
                columns[name] = [None if d is None else _RECORDS[name].from_dict(d) for d in columns[name]]
        fresh = _missing_fields(base)
        base = dict(sorted(base.items(), key=lambda kv: _POSITION.get(kv[0], len(_POSITION))))
        if "status" in columns:
            columns["status"] = list(map(_STATUS.__getitem__, columns["status"]))
        elif "status" in base:
            base["status"] = _STATUS[base["status"]]
        copy, names, rows = base.copy, list(columns), []
        if columns:
            for vals in zip(*columns.values()):
                d = copy()
                d.update(zip(names, vals))
                rows.append(d)
        else:
            rows = [copy() for _ in range(total)]
        if len(rows) != total:
            raise CheckpointError(f"buffer encoding holds {len(rows)} samples, group sizes say {total}")
        for name, factory in fresh:
            for d in rows:
                d[name] = factory()
        for i, extra in enc["extras"]:
            rows[i].update(extra)
        samples = list(map(object.__new__, repeat(Sample, total)))
        for s, d in zip(samples, rows):
            s.__dict__ = d
        ends = np.cumsum(sizes).tolist()
        return [samples[a:b] for a, b in zip([0] + ends[:-1], ends)]
