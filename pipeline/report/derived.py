"""Quantities the report derives from logged keys (nothing new is logged for them).

Zero-std groups: the log stage writes `rollout/zero_std/count_<r>` = the number of groups of
the train batch (groups of more than one sample) whose rewards all equal r, and
`rollout/num_samples`. With `n_samples_per_prompt` from the run's config the batch holds
`num_samples / n_samples_per_prompt` groups, so

    report/zero_std_fraction = Σ_r count_r / (num_samples / n_samples_per_prompt)

— the share of the batch that gives no GRPO signal. A dynamic filter such as `nonzero_std`
removes such groups before the batch, which makes this 0 by construction; the groups it dropped
are logged as `rollout/dynamic_filter/drop_zero_std_<r>` (and every drop, any reason, as
`rollout/dynamic_filter/drop_<reason>`), so when some were dropped

    report/zero_std_fraction_generated = (Σ count_r + Σ drop_zero_std_r) / (batch groups + Σ drop_<reason>)

is the share among the completed groups the filter judged (surplus groups carried to the buffer
are in neither count); it is derived for every rollout of a run in which the filter dropped a
zero-std group at least once. Nothing is derived when `n_samples_per_prompt` is unknown (no
`.hydra/config.yaml`) or is 1 (no group can have a spread).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["ZERO_STD_FRACTION", "ZERO_STD_FRACTION_GENERATED", "add_zero_std_fractions"]

ZERO_STD_FRACTION = "report/zero_std_fraction"
ZERO_STD_FRACTION_GENERATED = "report/zero_std_fraction_generated"

_COUNT = "rollout/zero_std/count_"
_DROP = "rollout/dynamic_filter/drop_"
_DROP_ZERO_STD = _DROP + "zero_std_"


def _number(v: Any) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _sum_prefix(row: dict[str, Any], prefix: str) -> float:
    return sum(_number(v) or 0.0 for k, v in row.items() if k.startswith(prefix))


def add_zero_std_fractions(rows: list[dict[str, Any]], n_samples_per_prompt: Any) -> None:
    """Add `report/zero_std_fraction` to each metrics row of a run, in place, and
    `report/zero_std_fraction_generated` to each when a filter dropped zero-std groups in any
    rollout of the run; see the module docstring for the formulas."""
    n = _number(n_samples_per_prompt)
    if n is None or n < 2:
        return
    filtered = any(_sum_prefix(row, _DROP_ZERO_STD) > 0 for row in rows)
    for row in rows:
        num_samples = _number(row.get("rollout/num_samples"))
        if num_samples is None or num_samples <= 0:
            continue
        groups = num_samples / n
        zero_std = _sum_prefix(row, _COUNT)
        row[ZERO_STD_FRACTION] = zero_std / groups
        if filtered:
            dropped = _sum_prefix(row, _DROP_ZERO_STD)
            row[ZERO_STD_FRACTION_GENERATED] = (zero_std + dropped) / (groups + _sum_prefix(row, _DROP))
