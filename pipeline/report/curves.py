"""The curves of the plots, computed before anything is drawn (so tests can check them).

A single run: one curve per key of a panel. A sweep: per group of jobs (same values of the
swept keys that are not averaged over), the mean over the group's jobs at each rollout_id with
a band of ± the sample standard deviation (n ≥ 2 jobs there), plus each job as a thin line.
Curves that may coincide get distinct line style, marker and a slight horizontal offset
(`OFFSET` rollout_ids between neighbours), so identical curves do not hide each other.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from pipeline.report.load import RunData
from pipeline.report.panels import Panel

__all__ = ["Band", "Curve", "OFFSET", "STYLES", "MARKERS", "band", "band_limits", "run_curves", "sweep_curves"]

STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# horizontal distance (in rollout_ids) between neighbouring curves of one panel
OFFSET = 0.06


@dataclass
class Band:
    """Mean and sample std over `n` jobs at each step (std 0 where only one job has a value)."""

    steps: list[int]
    mean: list[float]
    std: list[float]
    n: list[int]
    # the smallest value of any job at any step (a band is not drawn below 0 when this is >= 0)
    lowest: float


@dataclass
class Curve:
    """One line of one panel; `xs` are steps already shifted by `offset`."""

    panel: int
    key: str
    label: str
    xs: list[float]
    ys: list[float]
    colour: int
    style: str
    marker: str
    offset: float
    # sweep: the band drawn around the mean line (None for a single job)
    band: Band | None = None
    # sweep: a member job drawn thin under its group's mean
    thin: bool = False
    legend: bool = True
    members: list[str] = field(default_factory=list)


def _offsets(count: int) -> list[float]:
    return [(i - (count - 1) / 2) * OFFSET for i in range(count)]


def band(runs: list[RunData], key: str) -> Band:
    """Mean ± sample std of `key` over `runs` at each step where some run has a value."""
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for step, y in zip(run.steps(), run.series(key)):
            if y is not None:
                by_step.setdefault(step, []).append(y)
    steps = sorted(by_step)
    vals = [by_step[s] for s in steps]
    return Band(steps=steps, mean=[statistics.fmean(v) for v in vals],
                std=[statistics.stdev(v) if len(v) > 1 else 0.0 for v in vals], n=[len(v) for v in vals],
                lowest=min((min(v) for v in vals), default=0.0))


def band_limits(b: Band, fraction: bool) -> tuple[list[float], list[float]]:
    """The drawn band, mean ± std, kept in the quantity's range: not below 0 when no job went
    below 0, not above 1 for a fraction."""
    floor = 0.0 if b.lowest >= 0 else float("-inf")
    ceiling = 1.0 if fraction else float("inf")
    return ([max(floor, m - s) for m, s in zip(b.mean, b.std)], [min(ceiling, m + s) for m, s in zip(b.mean, b.std)])


def _points(run: RunData, key: str) -> list[tuple[int, float]]:
    return [(s, y) for s, y in zip(run.steps(), run.series(key)) if y is not None]


def run_curves(run: RunData, panels: list[tuple[Panel, list[str]]]) -> list[Curve]:
    """One curve per key of each panel: colour, style, marker and offset by the key's index."""
    curves = []
    for pi, (panel, keys) in enumerate(panels):
        offsets = _offsets(len(keys))
        for j, key in enumerate(keys):
            pts = _points(run, key)
            if pts:
                curves.append(Curve(pi, key, panel.label(key), [s + offsets[j] for s, _ in pts], [y for _, y in pts],
                                    colour=j, style=STYLES[j % len(STYLES)], marker=MARKERS[j % len(MARKERS)],
                                    offset=offsets[j], members=[run.name]))
    return curves


def sweep_curves(groups: list[tuple[str, list[RunData]]], panels: list[tuple[Panel, list[str]]]) -> list[Curve]:
    """Per panel, key and group: a mean curve (band when the group has ≥ 2 jobs) and thin member
    curves. Colour and marker follow the group, line style the key; offsets separate groups."""
    curves = []
    for pi, (panel, keys) in enumerate(panels):
        offsets = _offsets(len(groups))
        for j, key in enumerate(keys):
            style = STYLES[j % len(STYLES)]
            for gi, (label, members) in enumerate(groups):
                b = band(members, key)
                if not b.steps:
                    continue
                marker, dx = MARKERS[gi % len(MARKERS)], offsets[gi]
                name = label if len(keys) == 1 else f"{label}: {panel.label(key)}"
                if len(members) > 1:
                    for run in members:
                        pts = _points(run, key)
                        curves.append(Curve(pi, key, f"{name} job {run.name}", [s + dx for s, _ in pts],
                                            [y for _, y in pts], colour=gi, style=style, marker="", offset=dx,
                                            thin=True, legend=False, members=[run.name]))
                curves.append(Curve(pi, key, name, [s + dx for s in b.steps], b.mean, colour=gi, style=style,
                                    marker=marker, offset=dx, band=b if len(members) > 1 else None,
                                    members=[m.name for m in members]))
    return curves
