"""What the plotted series look like, decided before anything is drawn (so tests can check it).

Identical panels: two panels whose series are the same in every run (compared by value, not by
name: Reward and Pass rate for 0/1 rewards, where the mean reward is the share of reward-1
samples) are drawn once, titled with both names ("Reward = Pass rate (train)"); the tables keep
both columns; constant series are left apart. Constant series: a panel whose every value in every run lies within
`CONSTANT_RTOL` of the others (relative to their magnitude; exactly equal values for 0) is drawn
flat with the y range `flat_ylim` (the value ± 10 % of it, ± 1 around 0; ± 0.1 for a fraction)
instead of matplotlib's ± 0.02 autoscale, which makes a constant look like a signal; its table
column is marked "(constant)".
"""

from __future__ import annotations

from dataclasses import replace

from pipeline.report.load import RunData
from pipeline.report.panels import Panel

__all__ = ["CONSTANT_RTOL", "constant_value", "flat_ylim", "merge_identical"]

Panels = list[tuple[Panel, list[str]]]

# a series whose max - min is at most this fraction of max(|max|, |min|) counts as constant
CONSTANT_RTOL = 1e-6


def _values(runs: list[RunData], keys: list[str]) -> list[float]:
    return [v for r in runs for k in keys for v in r.series(k) if v is not None]


def constant_value(runs: list[RunData], keys: list[str]) -> float | None:
    """The value of `keys` when it is the same (within `CONSTANT_RTOL`) at every logged point of
    every run; None when it varies or fewer than two points were logged."""
    vals = _values(runs, keys)
    if len(vals) < 2:
        return None
    lo, hi = min(vals), max(vals)
    return (lo + hi) / 2 if hi - lo <= CONSTANT_RTOL * max(abs(lo), abs(hi)) else None


def flat_ylim(value: float, fraction: bool) -> tuple[float, float]:
    """The y range of a flat panel: `value` ± 10 % of |value|; around 0: ± 1 (± 0.1 for a fraction)."""
    half = 0.1 * abs(value) if value != 0 else (0.1 if fraction else 1.0)
    return value - half, value + half


def _signature(run: RunData, keys: list[str]) -> tuple[tuple[float | None, ...], ...]:
    return tuple(tuple(run.series(k)) for k in keys)


def merge_identical(runs: list[RunData], panels: Panels) -> tuple[Panels, list[str]]:
    """`panels` with each later panel whose series equal an earlier one's in every run (same
    number of keys, same values at the same steps) folded into that earlier panel, whose title
    then names both; also the merged titles ("A = B"). Constant series are not merged (each is
    drawn flat; a run that learned nothing would fold every all-0 panel into one)."""
    out: Panels = []
    sigs: list[tuple[tuple[tuple[float | None, ...], ...], ...]] = []
    merged: list[int] = []
    for panel, keys in panels:
        sig = tuple(_signature(r, keys) for r in runs)
        same = next((i for i, s in enumerate(sigs) if s == sig and len(out[i][1]) == len(keys)), None)
        if same is None or constant_value(runs, keys) is not None or not _values(runs, keys):
            out.append((panel, keys))
            sigs.append(sig)
            continue
        first, first_keys = out[same]
        out[same] = (replace(first, title=f"{first.title} = {panel.title}",
                             fraction=first.fraction or panel.fraction), first_keys)
        if same not in merged:
            merged.append(same)
    return out, [out[i][0].title for i in merged]
