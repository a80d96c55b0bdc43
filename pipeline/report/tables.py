"""Markdown tables: per-rollout rows of one run; per-job and per-group comparisons of a sweep."""

from __future__ import annotations

import statistics
from collections.abc import Collection
from typing import Any

from pipeline.report.load import RunData
from pipeline.report.panels import Panel

__all__ = ["group_runs", "notes", "run_table", "seed_keys", "swept_keys", "sweep_tables"]


def _fmt(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}g}"


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _columns(panels: list[tuple[Panel, list[str]]], constant: Collection[str] = ()) -> list[tuple[str, str]]:
    """(column name, metric key) for the first present key of each panel; the name of a key in
    `constant` (the same value throughout) ends in " (constant)"."""
    return [(panel.column + (" (constant)" if keys[0] in constant else ""), keys[0]) for panel, keys in panels if keys]


def notes(panels: list[tuple[Panel, list[str]]]) -> list[str]:
    """How the derived columns are computed (one bullet per panel with a note)."""
    lines = [f"- {panel.note}" for panel, keys in panels if keys and panel.note]
    return ["", "Columns:", ""] + lines if lines else []


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def run_table(run: RunData, panels: list[tuple[Panel, list[str]]], constant: Collection[str] = ()) -> list[str]:
    """One row per rollout_id with the panel quantities ("–" where a step lacks one, e.g. eval);
    the columns of the keys in `constant` are marked "(constant)"."""
    cols = _columns(panels, constant)
    rows = [[str(step)] + [_fmt(run.series(key)[i]) for _, key in cols] for i, step in enumerate(run.steps())]
    return _table(["rollout_id"] + [c for c, _ in cols], rows) + notes(panels)


def swept_keys(runs: list[RunData]) -> list[str]:
    """Override keys whose value differs between jobs, in command-line order."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run.overrides if k not in keys]
    return [k for k in keys if len({run.overrides.get(k) for run in runs}) > 1]


def seed_keys(swept: list[str]) -> list[str]:
    """Swept keys that are seeds (their last dotted part contains 'seed'): averaged over."""
    return [k for k in swept if "seed" in k.rsplit(".", 1)[-1]]


def group_runs(runs: list[RunData], by: list[str]) -> list[tuple[dict[str, str], list[RunData]]]:
    """Runs grouped by their values of `by`, groups in first-seen order."""
    groups: dict[tuple[str | None, ...], list[RunData]] = {}
    for run in runs:
        groups.setdefault(tuple(run.overrides.get(k) for k in by), []).append(run)
    return [({k: v or "" for k, v in zip(by, key)}, members) for key, members in groups.items()]


def _spread(values: list[float | None]) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "–"
    if len(vals) == 1:
        return _fmt(vals[0])
    return f"{statistics.fmean(vals):.3g} ± {statistics.stdev(vals):.2g}"


def sweep_tables(runs: list[RunData], panels: list[tuple[Panel, list[str]]],
                 over: list[str] | None = None, constant: Collection[str] = ()) -> tuple[list[str], dict[str, Any]]:
    """Markdown lines (a per-group table, then a per-job table) and their data as a dict.

    Each job is summarised by the mean over the rollouts that logged a quantity (eval: its eval
    points); a group (same values of the swept keys not in `over`, default: the swept seed keys)
    shows mean ± sample std over its jobs. Columns of the keys in `constant` (the same value in
    every rollout of every job) are marked "(constant)".
    """
    swept = swept_keys(runs)
    over = seed_keys(swept) if over is None else over
    by = [k for k in swept if k not in over]
    cols = _columns(panels, constant)
    per_job = {run.name: {c: _mean(run.series(key)) for c, key in cols} for run in runs}
    lines = [f"Each job: mean over the rollouts that logged a column (eval: its eval points). "
             f"Grouped by {', '.join(by) or '(nothing)'}; "
             f"± is the standard deviation over {', '.join(over) or 'jobs'}.", ""]
    group_rows, data_groups = [], []
    for values, members in group_runs(runs, by):
        cells = {c: [per_job[m.name][c] for m in members] for c, _ in cols}
        group_rows.append([values[k] for k in by] + [str(len(members))] + [_spread(cells[c]) for c, _ in cols])
        data_groups.append({"group": values, "jobs": [m.name for m in members], "values": cells})
    lines += _table(by + ["jobs"] + [c for c, _ in cols], group_rows)
    lines += ["", "Per job:", ""]
    job_rows = [[run.name, " ".join(f"{k}={run.overrides.get(k, '')}" for k in swept), str(len(run.rows))]
                + [_fmt(per_job[run.name][c]) for c, _ in cols] for run in runs]
    lines += _table(["job", "swept overrides", "rollouts"] + [c for c, _ in cols], job_rows) + notes(panels)
    data = {"swept": swept, "over": over, "group_by": by, "columns": dict(cols), "groups": data_groups,
            "jobs": per_job}
    return lines, data
