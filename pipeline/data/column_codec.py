"""Column codecs for the checkpoint buffer: numeric per-token lists packed into arrays.

Used by `pipeline.data.sample_codec`. A column of lists (tokens, loss masks, log-probs) becomes
one concatenated array in the smallest exact dtype plus lengths; all-1 int lists are stored as
lengths only, bit-identical rows once, a prompt shared by a group's token lists once per group.
Scalar and dict columns become constants, interned strings, packed ints or per-key columns.
Packed arrays are base64 text in the JSON-able form and numpy arrays in the binary checkpoint.
"""

from __future__ import annotations

import array
import base64
import operator
from collections import deque
from itertools import chain, repeat
from typing import Any

import numpy as np

from pipeline.data.errors import CheckpointError

__all__ = ["decode_array", "decode_column", "encode_array", "encode_column", "json_default", "pack_b64", "pack_raw"]


def pack_b64(arr: np.ndarray) -> str:
    """An array as base64 text (the JSON-able state)."""
    return base64.b64encode(arr.tobytes()).decode()


def json_default(obj: Any) -> str:
    """`json.dumps` hook: a packed numpy array (as `read_checkpoint` returns) as base64 text."""
    if isinstance(obj, np.ndarray):
        return pack_b64(np.ascontiguousarray(obj, dtype=obj.dtype.newbyteorder("<")))
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def pack_raw(arr: np.ndarray) -> np.ndarray:
    """An array as it is (the binary checkpoint stores its bytes)."""
    return arr


def _unpack(value: str | np.ndarray, dtype: str) -> np.ndarray:
    """A packed array: base64 text (JSON state) or the array itself (binary checkpoint)."""
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value), dtype=dtype)
    return np.asarray(value, dtype=dtype)


def _smallest_int(arr: np.ndarray) -> np.ndarray:
    if arr.size == 0:
        return arr.astype("<i4")
    lo, hi = int(arr.min()), int(arr.max())
    for dtype in ("<u1", "<i1", "<u2", "<i2", "<u4", "<i4"):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return arr.astype(dtype)
    return arr.astype("<i8")


def _packed(code: str, present: list[list[Any]]) -> np.ndarray:
    """The lists concatenated into a C array (`array.fromlist` per list: one pass in C, no
    intermediate flat list). TypeError / OverflowError when a value does not fit `code`."""
    arr = array.array(code)
    deque(map(arr.fromlist, present), maxlen=0)
    return np.frombuffer(arr, dtype={"i": np.intc, "q": np.int64}.get(code, np.float64))


def _flat_numbers(present: list[list[Any]], kind: type) -> np.ndarray | None:
    """All values of `present` concatenated as a numpy array, or None when not all numbers.

    Ints as a C `long long` array, then the smallest exact dtype; floats (ints allowed) as a
    C double array, then float32 when that is bit-exact. No per-value Python. A column that
    fits a byte (loss masks) must hold only ints: a mask of bools stays a JSON list so they
    come back as bools (beyond a byte, a bool among ints would come back as the equal int).
    """
    try:
        try:  # a C int array first (token ids fit): `fromlist` into it is faster
            arr = _packed("i" if kind is int else "d", present)
        except OverflowError:
            arr = _packed("q", present)
    except (TypeError, OverflowError):
        return None
    if kind is int:
        small = _smallest_int(arr)
        if small.dtype == np.uint8 and small.size and \
                operator.countOf(map(type, chain.from_iterable(present)), int) != small.size:
            return None
        return small
    f32 = arr.astype("<f4")
    exact = np.array_equal(f32.astype(np.float64).view(np.uint64), arr.view(np.uint64))  # bit-exact
    return f32 if exact else arr.astype("<f8")


def _all_ones(present: list[list[Any]]) -> bool:
    """Whether every value of every list is the int 1 (a loss mask that trains on everything)."""
    try:  # `==` on foreign values (numpy arrays) may raise: then they are not plain 1s
        first = next(filter(None, present), [])
        if first.count(1) != len(first):  # cheap early out (token ids)
            return False
        total = sum(map(len, present))
        return sum(map(list.count, present, repeat(1))) == total \
            and operator.countOf(map(type, chain.from_iterable(present)), int) == total  # no True / 1.0
    except (TypeError, ValueError):
        return False


def _split(data: np.ndarray, lengths: np.ndarray) -> list[list[Any]]:
    """`data` cut into fresh lists of `lengths` (all >= 0): one `.tolist()`, then slices."""
    if len(lengths) and lengths[0] > 0 and (lengths == lengths[0]).all():
        return data.reshape(len(lengths), int(lengths[0])).tolist()  # equal lengths: one C call
    flat = data.tolist()
    ends = np.cumsum(lengths).tolist()
    return [flat[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _shared_prefix(arr: np.ndarray, lengths: np.ndarray, sizes: list[int],
                   response_lengths: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(prefix length per group, the group prefixes, the rest of every row) when the samples
    of every group start with the same prompt (`tokens[:len - response_length]`), else None.

    Vectorised: no per-sample Python. Stored once per group, the prompt also comes back as
    one list per group whose (immutable) ints every sample's fresh token list shares.
    """
    sz = np.asarray(sizes, dtype=np.int64)
    if not len(sz) or (sz <= 0).any() or len(response_lengths) != len(lengths) or \
            set(map(type, response_lengths)) != {int}:
        return None
    lens = lengths.astype(np.int64)
    first = np.repeat(np.cumsum(sz) - sz, sz)  # each sample's group's first sample
    try:
        prompt = lens - np.asarray(response_lengths, dtype=np.int64)
    except OverflowError:
        return None
    if (prompt < 0).any() or (prompt != prompt[first]).any() or \
            not prompt[first != np.arange(len(lens))].any():  # nothing to share
        return None
    starts = np.cumsum(lens) - lens
    offs = np.arange(int(prompt.sum())) - np.repeat(np.cumsum(prompt) - prompt, prompt)
    idx = np.repeat(starts, prompt) + offs
    if not (arr[idx] == arr[np.repeat(starts[first], prompt) + offs]).all():
        return None
    rest = np.ones(len(arr), dtype=bool)
    rest[idx] = False
    lead = first == np.arange(len(lens))
    return prompt[lead], arr[idx[np.repeat(lead, prompt)]], arr[rest]


def encode_array(values: list[Any], kind: type, pack: Any,
                  groups: tuple[list[int], list[Any]] | None = None) -> dict[str, Any] | None:
    """Packed flat values + lengths for a column of `list[number] | None` (None: not numeric).

    Ints use the smallest integer dtype that holds them; floats use float32 when that is
    exact for every value (log-probs of float32 engines), else float64. Values compare equal
    after a round trip (an int inside a float list comes back as the equal float). An int
    column of nothing but 1s (the common loss mask) stores only its lengths (`"fill": 1`).
    With `groups` (group sizes, response lengths), a prompt shared by a group is stored once.
    """
    present = [v for v in values if v is not None] if any(map(operator.is_, values, repeat(None))) else values
    if not set(map(type, present)) <= {list}:
        return None
    if len(present) == len(values):
        lengths = _smallest_int(np.fromiter(map(len, values), np.int64, len(values)))
    else:
        lengths = _smallest_int(np.fromiter((-1 if v is None else len(v) for v in values), np.int64, len(values)))
    head = {"lengths": pack(lengths), "lengths_dtype": lengths.dtype.str}
    if kind is int and present and _all_ones(present):
        return {**head, "fill": 1}
    arr = _flat_numbers(present, kind)
    if arr is None:
        return None
    if len(present) == len(values) and len(lengths) > 1 and lengths[0] > 0 and (lengths == lengths[0]).all():
        rows = arr.reshape(len(lengths), int(lengths[0]))
        bits = rows.view(f"<u{rows.dtype.itemsize}")  # bit-exact (-0.0, NaN payloads)
        if (bits == bits[0]).all():  # every sample holds the same list: store it once
            return {"dtype": arr.dtype.str, **head, "data": pack(rows[0]), "same_rows": True}
    shared = _shared_prefix(arr, lengths, *groups) if groups and len(present) == len(values) else None
    if shared is not None:
        plens = _smallest_int(shared[0])
        return {"dtype": arr.dtype.str, **head, "data": pack(shared[2]), "prefix": pack(shared[1]),
                "prefix_lengths": pack(plens), "prefix_lengths_dtype": plens.dtype.str}
    return {"dtype": arr.dtype.str, **head, "data": pack(arr)}


def decode_array(enc: dict[str, Any], sizes: list[int]) -> list[list[Any] | None]:
    """Invert `encode_array`: a fresh list (or None) per sample; `sizes` are the group sizes."""
    lengths = _unpack(enc["lengths"], enc["lengths_dtype"]).astype(np.int64)
    if "prefix" in enc:  # one prompt per group + each sample's rest: fresh concatenated lists
        plens = _unpack(enc["prefix_lengths"], enc["prefix_lengths_dtype"]).astype(np.int64)
        rest_lengths = lengths - np.repeat(plens, sizes) if len(plens) == len(sizes) else None
        if rest_lengths is None or len(rest_lengths) != len(lengths) or (rest_lengths < 0).any():
            raise CheckpointError(f"tokens: {len(plens)} shared prompts do not fit {len(sizes)} groups")
        prompts = _split(_unpack(enc["prefix"], enc["dtype"]), plens)
        rest = _split(_unpack(enc["data"], enc["dtype"]), rest_lengths)
        return list(map(operator.add, chain.from_iterable(map(repeat, prompts, sizes)), rest))
    if "fill" in enc:  # a fresh list per sample: [fill] * length
        out: list[list[Any] | None] = list(map(operator.mul, repeat([enc["fill"]]),
                                               np.maximum(lengths, 0).tolist()))
        for i in np.flatnonzero(lengths < 0).tolist():
            out[i] = None
        return out
    data = _unpack(enc["data"], enc["dtype"])
    if data.dtype.kind == "f":
        data = data.astype(np.float64)  # float32 values come back as the same Python floats
    if enc.get("same_rows"):  # a fresh list per sample, sharing the (immutable) numbers
        return list(map(list, repeat(data.tolist(), len(lengths))))
    if len(lengths) and (lengths == lengths[0]).all() and lengths[0] > 0:
        return data.reshape(len(lengths), int(lengths[0])).tolist()  # equal lengths: one C call
    flat = data.tolist()
    ends = np.cumsum(np.maximum(lengths, 0)).tolist()
    out = [flat[a:b] for a, b in zip([0] + ends[:-1], ends)]
    for i in np.flatnonzero(lengths < 0).tolist():
        out[i] = None
    return out


_SCALARS = (str, int, float, bool, type(None))


def encode_column(values: list[Any], pack: Any) -> Any:
    """A field column: one constant, all-empty containers, interned strings, a packed int
    array, dicts with the same keys as one column per key, or the plain JSON list."""
    if not values:
        return {"values": values}
    first = values[0]
    if type(first) in _SCALARS:
        kinds = set(map(type, values))
        if len(kinds) == 1 and values.count(first) == len(values):
            return {"const": first}
        if kinds == {str}:
            table = {v: i for i, v in enumerate(dict.fromkeys(values))}
            small = _smallest_int(np.fromiter(map(table.__getitem__, values), np.int64, len(values)))
            return {"strings": list(table), "index": pack(small), "index_dtype": small.dtype.str}
        if kinds == {int}:
            try:
                ints = _smallest_int(np.frombuffer(array.array("q", values), dtype=np.int64))
            except OverflowError:
                return {"values": values}
            return {"ints": pack(ints), "ints_dtype": ints.dtype.str}
    elif type(first) in (list, dict) and not first and set(map(type, values)) == {type(first)} \
            and not any(values):
        return {"empty": "list" if type(first) is list else "dict"}  # e.g. weight_versions
    elif type(first) is dict and all(type(k) is str for k in first) and set(map(type, values)) == {dict} \
            and len(set(map(tuple, values))) == 1:  # dicts with the same keys (metadata): per key
        return {"records": list(first),
                "fields": {k: encode_column(list(map(operator.itemgetter(k), values)), pack) for k in first}}
    return {"values": values}


def decode_column(enc: dict[str, Any], total: int) -> list[Any]:
    """Invert `encode_column` for `total` samples (fresh containers per sample)."""
    if "const" in enc:
        return [enc["const"]] * total
    if "strings" in enc:
        strings = enc["strings"]
        idx = _unpack(enc["index"], enc["index_dtype"]).tolist()
        return list(map(strings.__getitem__, idx))
    if "ints" in enc:
        return _unpack(enc["ints"], enc["ints_dtype"]).tolist()
    if "records" in enc:  # a fresh dict per sample
        fields = [decode_column(enc["fields"][k], total) for k in enc["records"]]
        return list(map(dict, map(zip, repeat(enc["records"]), zip(*fields))))
    if "empty" in enc:  # a fresh container per sample
        return [[] for _ in range(total)] if enc["empty"] == "list" else [{} for _ in range(total)]
    return enc["values"]
