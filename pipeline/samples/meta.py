"""The parts of `Sample` that slime keeps beside its fields (docs/contracts.md §1).

- `SampleStatus` (`Sample.Status`) and `coerce_status`: any enum member or string with a known
  status value becomes our member, so a slime plugin's own `Sample.Status` works here.
- `SpecInfo` / `PrefixCacheInfo` (`Sample.SpecInfo`, `Sample.PrefixCacheInfo`): speculative-decoding
  and prefix-cache counters summed over an engine's `meta_info`s.
- `meta_int_list`, `top_p_spans`, `routed_experts_rows`: engine `meta_info` arrays (base64 int32,
  bytes, tensors, arrays or lists) as plain int lists, checked the way slime checks them.
- `StatusAttribute` / `LazyRecord`: the data descriptors behind `Sample.status` (coerced on every
  assignment) and `Sample.spec_info` / `Sample.prefix_cache_info` (made on first access, so the
  millions of samples a data source hands out cost no extra objects). Both keep their value in the
  instance `__dict__` under the field name, where the codecs and fast constructors look.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

__all__ = [
    "SampleStatus", "coerce_status", "SpecInfo", "PrefixCacheInfo", "StatusAttribute", "LazyRecord",
    "meta_int_list", "top_p_spans", "routed_experts_rows",
]


class SampleStatus(str, Enum):
    """Lifecycle of a sample; the values are the strings used in dumps and checkpoints.

    A member also equals a member of another enum with the same value (slime's own
    `Sample.Status`), so comparisons written against slime's class keep working.
    """

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Enum) and not isinstance(other, SampleStatus):
            other = other.value
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__  # equal to its value string, so it hashes like it


SampleStatus.__name__ = "Status"  # as users see it (reprs); the qualname stays importable (pickle)
_BY_VALUE = {s.value: s for s in SampleStatus}


def coerce_status(value: Any) -> SampleStatus:
    """`value` as a `Sample.Status`: our member, any enum member whose value is a status string
    (slime's `Sample.Status`), or the string itself. Anything else is a ValueError that lists
    the accepted values."""
    if value.__class__ is SampleStatus:
        return value
    raw = value.value if isinstance(value, Enum) else value
    try:
        return _BY_VALUE[raw]
    except (KeyError, TypeError):
        raise ValueError(
            f"sample status {value!r} is not a known status; expected Sample.Status (ours or slime's) "
            f"or one of the strings {sorted(_BY_VALUE)}") from None


class StatusAttribute:
    """`Sample.status`: every assignment is coerced with `coerce_status` (the plugin boundary)."""

    def __init__(self, default: SampleStatus) -> None:
        self.default = default

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self.default  # the dataclass field default
        try:
            return obj.__dict__["status"]
        except KeyError:
            raise AttributeError("status") from None

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__["status"] = coerce_status(value)


class _Counters:
    """Integer counters summed over a sample's engine answers (a dataclass's fields);
    `from_meta` names the meta_info key each counter adds up."""

    from_meta: dict[str, str]  # set by each subclass (a plain class attribute, not a field)

    def add(self, meta_info: dict[str, Any]) -> None:
        """Add one engine answer's counters (a missing key adds 0)."""
        for name, key in self.from_meta.items():
            setattr(self, name, getattr(self, name) + meta_info.get(key, 0))

    def to_dict(self) -> dict[str, Any]:
        """The counters as a plain dict."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """Inverse of `to_dict`; missing counters are 0, unknown keys are ignored (as slime)."""
        return cls(**{f.name: data.get(f.name, 0) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


@dataclass
class SpecInfo(_Counters):
    """Speculative-decoding counters of one sample, summed over its engine calls."""

    spec_accept_token_num: int = 0
    spec_draft_token_num: int = 0
    spec_verify_ct: int = 0
    completion_token_num: int = 0

    @property
    def spec_accept_rate(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.spec_accept_token_num / self.spec_draft_token_num if self.spec_draft_token_num > 0 else 0.0

    @property
    def spec_accept_length(self) -> float:
        """Completion tokens per verify step (0 before any step)."""
        return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct > 0 else 0.0


SpecInfo.from_meta = {"spec_accept_token_num": "spec_accept_token_num", "spec_draft_token_num": "spec_draft_token_num",
                      "spec_verify_ct": "spec_verify_ct", "completion_token_num": "completion_tokens"}


@dataclass
class PrefixCacheInfo(_Counters):
    """Prefix-cache counters of one sample, summed over its engine calls."""

    cached_tokens: int = 0
    total_prompt_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Cached / prompt tokens (0 before any prompt)."""
        return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens > 0 else 0.0


PrefixCacheInfo.from_meta = {"cached_tokens": "cached_tokens", "total_prompt_tokens": "prompt_tokens"}


class LazyRecord:
    """`Sample.spec_info` / `Sample.prefix_cache_info`: made on first read; a dict assigned (as in a
    dump) becomes the record. None in the instance `__dict__` means "not made yet" (all zero)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return None  # the dataclass field default: made on first read
        value = obj.__dict__.get(self.name)
        if value is None:
            value = obj.__dict__[self.name] = self.cls()
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        if isinstance(value, dict):
            value = self.cls.from_dict(value)
        elif value is not None and not isinstance(value, self.cls):
            raise TypeError(f"Sample.{self.name} must be a Sample.{self.cls.__name__} or a dict, "
                            f"got {type(value).__name__}")
        obj.__dict__[self.name] = value


# ----------------------------------------------------------------------------- meta_info arrays
_TOP_P_IDS = ("top_p_token_ids", "top_p_kept_token_ids")
_TOP_P_OFFSETS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def meta_int_list(meta_info: dict[str, Any], keys: str | Iterable[str]) -> list[int] | None:
    """The first of `keys` in `meta_info` as a flat int list (None when absent or None).

    A string is base64 of little-endian int32 values (what SGLang sends), bytes are those values
    raw; tensors, numpy arrays and (nested) lists are flattened.
    """
    for key in (keys,) if isinstance(keys, str) else keys:
        if key in meta_info:
            value = meta_info[key]
            break
    else:
        return None
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = base64.b64decode(value, validate=True)
        except ValueError as exc:  # binascii.Error
            raise ValueError(f"meta_info[{key!r}]: not base64 int32 values ({exc})") from None
    if isinstance(value, (bytes, bytearray, memoryview)):
        if len(value) % 4:
            raise ValueError(f"meta_info[{key!r}]: {len(value)} bytes are not whole int32 values")
        return np.frombuffer(value, dtype="<i4").tolist()
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.int64).reshape(-1).tolist()


def top_p_spans(meta_info: dict[str, Any], new_tokens: int) -> tuple[list[int], list[int]] | None:
    """(kept token ids, offsets) of the top-p replay spans in `meta_info` for `new_tokens` tokens,
    or None when it has none. Token i kept `ids[offsets[i]:offsets[i + 1]]`."""
    ids, offsets = meta_int_list(meta_info, _TOP_P_IDS), meta_int_list(meta_info, _TOP_P_OFFSETS)
    if ids is None and offsets is None:
        return None
    if ids is None or offsets is None:
        raise ValueError("meta_info: top-p replay needs both token ids and offsets, got only "
                         + ("ids" if offsets is None else "offsets"))
    if not offsets or offsets[0] != 0:
        raise ValueError(f"meta_info: top-p offsets must start with 0, got {offsets[:1]}")
    if offsets[-1] != len(ids):
        raise ValueError(f"meta_info: top-p offsets end at {offsets[-1]} but there are {len(ids)} token ids")
    if len(offsets) != new_tokens + 1:
        raise ValueError(f"meta_info: {len(offsets)} top-p offsets for {new_tokens} new tokens "
                         f"(expected {new_tokens + 1})")
    return ids, offsets


def routed_experts_rows(meta_info: dict[str, Any], args: Any, num_tokens: int,
                        existing: list[Any] | None) -> list[Any] | None:
    """`meta_info["routed_experts"]` as [token][layer][top-k] rows for a sample of `num_tokens`
    tokens, spliced after `routed_experts_start_len` earlier rows; None when absent."""
    flat = meta_int_list(meta_info, "routed_experts")
    if flat is None:
        return None
    layers, topk = getattr(args, "num_layers", None), getattr(args, "moe_router_topk", None)
    if not layers or not topk:
        raise ValueError("meta_info carries routed_experts: args.num_layers and args.moe_router_topk "
                         "are needed to shape them (set them with +num_layers=... +moe_router_topk=...)")
    start = int(meta_info.get("routed_experts_start_len", 0) or 0)
    if start < 0:
        raise ValueError(f"meta_info: routed_experts_start_len must be >= 0, got {start}")
    rows = max(0, num_tokens - 1 - start)
    if len(flat) != rows * layers * topk:
        raise ValueError(f"meta_info: routed_experts element count {len(flat)} does not match {rows} tokens x "
                         f"{layers} layers x top-{topk} (tokens={num_tokens}, routed_experts_start_len={start})")
    shaped = np.asarray(flat, dtype=np.int64).reshape(rows, layers, topk).tolist()
    if start == 0:
        return shaped
    if existing is None or len(existing) < start:
        raise ValueError(f"meta_info: routed_experts_start_len={start} but the sample has "
                         f"{0 if existing is None else len(existing)} routed-expert rows")
    old = existing.tolist() if hasattr(existing, "tolist") else list(existing)
    return old[:start] + shaped
