"""Weight versions of a Sample's tokens: which policy made each token, staleness, masking.

Two records, both kept by `Sample.append_response_tokens`:
- `weight_versions` (slime's field, strings): one entry per engine call, the version that
  finished it; a call the weights changed during appends each version it saw, in order.
- `metadata["weight_version_runs"]`: every response token's version, run-length encoded as
  `[[version, count], ...]` over the response in order (`None` for tokens no engine made, e.g.
  tool output, and for earlier tokens appended without versions); present only once a response
  mixes versions (while one version made all of it, its `weight_versions` entry says so, and
  a run without weight updates dumps exactly the fields it did before).

Staleness of a sample (or group) at serving version `v` is `v - oldest version among its
tokens` (0 for a sample without generated tokens). The rollout in progress publishes `v` through
`serving_version()`, so a buffer filter can bound staleness in weight versions.
"""

from __future__ import annotations

import contextvars
from typing import Any, Iterable

__all__ = ["RUNS_KEY", "extend_runs", "token_versions", "oldest_version", "staleness",
           "group_staleness", "staleness_metrics", "call_versions", "mask_older_than_newest", "serving_version",
           "set_serving_version", "reset_serving_version", "as_version"]

RUNS_KEY = "weight_version_runs"

_SERVING: contextvars.ContextVar[int | None] = contextvars.ContextVar("serving_weight_version", default=None)


def as_version(value: Any) -> int | None:
    """A version as an int ("3" -> 3); None for None or a non-numeric tag (SGLang's "default")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def extend_runs(sample: Any, versions: list[int | None] | None, new: int) -> None:
    """Record the versions of `new` tokens about to be appended to `sample` (`versions` None:
    unknown). The runs are stored only once the response mixes versions (or known and unknown
    ones); while one version made every token, `weight_versions` says it all."""
    runs = sample.metadata.get(RUNS_KEY)
    before = int(sample.response_length)
    if runs is None:
        if versions is None and (not before or _single(sample) is None):
            return  # nothing known about any token yet
        out = [[_single(sample), before]] if before else []
    else:
        out = [list(r) for r in runs]
    for version in versions if versions is not None else [None] * new:
        if out and out[-1][0] == version:
            out[-1][1] += 1
        else:
            out.append([version, 1])
    if runs is not None or len(out) > 1 or (out and out[0][0] is None):
        sample.metadata[RUNS_KEY] = out


def _single(sample: Any) -> int | None:
    """The one version in `weight_versions`, or None when there is none or several."""
    known = {as_version(v) for v in getattr(sample, "weight_versions", None) or []}
    return known.pop() if len(known) == 1 else None


def token_versions(sample: Any) -> list[int | None]:
    """One version per response token (None where unknown)."""
    runs = (getattr(sample, "metadata", None) or {}).get(RUNS_KEY)
    if runs is None:
        return [_single(sample)] * int(sample.response_length)
    out: list[int | None] = []
    for version, count in runs:
        out.extend([as_version(version)] * int(count))
    return out


def oldest_version(sample: Any) -> int | None:
    """The oldest version among the sample's tokens (runs first, else `weight_versions`)."""
    runs = (getattr(sample, "metadata", None) or {}).get(RUNS_KEY)
    values = [r[0] for r in runs if r[1]] if runs is not None else list(getattr(sample, "weight_versions", None) or [])
    known = [v for v in (as_version(x) for x in values) if v is not None]
    return min(known) if known else None


def staleness(sample: Any, current: int) -> int:
    """`current - oldest version` of the sample's tokens (0 without generated tokens)."""
    oldest = oldest_version(sample) if getattr(sample, "response_length", 0) else None
    return max(0, current - oldest) if oldest is not None else 0


def group_staleness(group: Iterable[Any], current: int) -> int:
    """The largest staleness among a group's samples."""
    return max((staleness(s, current) for s in group), default=0)


def staleness_metrics(samples: Iterable[Any], current: int) -> dict[str, float]:
    """`rollout/weight_staleness` (max) and `rollout/weight_staleness_mean` (mean) over the
    samples' response tokens of known version: `current` minus the version that made each token."""
    lags = [current - v for s in samples for v in token_versions(s) if v is not None]
    return {"rollout/weight_staleness": float(max(lags, default=0)),
            "rollout/weight_staleness_mean": sum(lags) / len(lags) if lags else 0.0}


def call_versions(meta: dict[str, Any]) -> list[Any]:
    """The `weight_versions` entries one engine answer adds: each distinct per-token version in
    order (as strings), ending with `meta["weight_version"]` as given (slime appends just that)."""
    out: list[Any] = []
    for v in meta.get("token_weight_versions") or []:
        if not out or str(out[-1]) != str(v):
            out.append(str(v))
    if "weight_version" in meta:
        if out and str(out[-1]) == str(meta["weight_version"]):
            out.pop()
        out.append(meta["weight_version"])
    return out


def mask_older_than_newest(sample: Any) -> int:
    """Loss mask 0 for tokens made by a version older than the sample's newest one (an update
    happened while the sample was generated); returns how many were newly masked."""
    versions = token_versions(sample)
    known = [v for v in versions if v is not None]
    if not known or min(known) == max(known):
        return 0
    newest = max(known)
    mask = list(sample.loss_mask) if sample.loss_mask is not None else [1] * sample.response_length
    masked = 0
    for i, v in enumerate(versions):
        if v is not None and v < newest and mask[i]:
            mask[i] = 0
            masked += 1
    sample.loss_mask = mask
    return masked


def serving_version() -> int | None:
    """The weight version the engine of the rollout in progress serves (None outside one)."""
    return _SERVING.get()


def set_serving_version(version: int | None) -> contextvars.Token:
    """Publish the serving version for code called from this context (buffer filters)."""
    return _SERVING.set(version)


def reset_serving_version(token: contextvars.Token) -> None:
    """Undo `set_serving_version` (the token it returned)."""
    _SERVING.reset(token)
