"""Assemble the report of a run or a sweep dir: plots + report.md + report.json."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.process.atomic import atomic_write_bytes
from pipeline.report.curves import OFFSET, run_curves, sweep_curves
from pipeline.report.load import NoMetricsError, RunData, find_runs
from pipeline.report.panels import Panel, all_zero, select_panels
from pipeline.report.plots import plot_curves
from pipeline.report.shape import constant_value, merge_identical
from pipeline.report.tables import group_runs, run_table, seed_keys, swept_keys, sweep_tables

__all__ = ["write_report"]

logger = logging.getLogger(__name__)

Panels = list[tuple[Panel, list[str]]]


def _write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _plotted(runs: list[RunData], panels: Panels) -> tuple[Panels, list[str], list[str]]:
    """The panels to draw (identical ones merged: `shape.merge_identical`), the titles of those
    left out because they are 0 throughout, and the merged titles."""
    hidden = [p.title for p, keys in panels if p.hide_if_zero and all_zero(runs, keys)]
    plotted, merged = merge_identical(runs, [(p, keys) for p, keys in panels if p.title not in hidden])
    return plotted, hidden, merged


def _flat(runs: list[RunData], plotted: Panels) -> dict[int, float]:
    """Plotted panel index -> the value of a panel that is constant throughout (drawn flat)."""
    values = {i: constant_value(runs, keys) for i, (_, keys) in enumerate(plotted)}
    return {i: v for i, v in values.items() if v is not None}


def _constant_keys(runs: list[RunData], panels: Panels) -> set[str]:
    """Table column keys (a panel's first key) whose value never changes: marked "(constant)"."""
    return {keys[0] for _, keys in panels if keys and constant_value(runs, keys[:1]) is not None}


def _notice_lines(hidden: list[str], merged: list[str]) -> list[str]:
    lines = [f"Not plotted (0 in every rollout; in the tables): {', '.join(hidden)}."] if hidden else []
    if merged:
        lines.append(f"Drawn once (the same values in every rollout; both in the tables): {', '.join(merged)}.")
    return lines + [""] if lines else []


def _run_report(run: RunData, panels: Panels, plotted: Panels, out: Path,
                title: str) -> tuple[list[str], dict[str, Any], Path]:
    curves = run_curves(run, plotted)
    plot = plot_curves(plotted, curves, out / "run.png", title=f"{title}: metrics over rollout_id",
                       flat=_flat([run], plotted))
    lines = [f"# Report: {title}", "", f"{len(run.rows)} rollouts from `{run.path / 'metrics.jsonl'}`.", "",
             f"![metrics over rollout_id]({plot.name})", ""] + run_table(run, panels, _constant_keys([run], panels))
    return lines, {"rows": run.rows}, plot


def _sweep_report(runs: list[RunData], panels: Panels, plotted: Panels, out: Path, title: str,
                  over: list[str] | None) -> tuple[list[str], dict[str, Any], Path]:
    swept = swept_keys(runs)
    over = seed_keys(swept) if over is None else over
    by = [k for k in swept if k not in over]
    groups = []
    for values, members in group_runs(runs, by):
        name = " ".join(f"{_short(k)}={v}" for k, v in values.items()) or "all jobs"
        jobs = ", ".join(m.name for m in members)
        groups.append((f"{name} ({len(members)} job{'s' if len(members) > 1 else ''}: {jobs})", members))
    if any(len(m) > 1 for _, m in groups):
        values = f"the {', '.join(map(_short, over)) or 'job'} values"
        how = (f"colour + marker: {', '.join(map(_short, by)) or 'all jobs'}; thick line: mean over {values}; "
               f"thin lines: single jobs\nband: ± std over {values} (cut at 0, and at 1 for fractions)")
    else:
        how = "one curve per job"
    curves = sweep_curves(groups, plotted)
    spread = OFFSET * (len(groups) - 1) / 2
    shift = f"; curves shifted by up to ±{spread:.2g} rollout_id so equal ones stay visible" if spread else ""
    plot = plot_curves(plotted, curves, out / "sweep.png", groups=[g for g, _ in groups],
                       title=f"{title}: {len(runs)} jobs\n{how}{shift}", flat=_flat(runs, plotted))
    table, data = sweep_tables(runs, panels, over, _constant_keys(runs, panels))
    lines = [f"# Report: {title}", "", f"{len(runs)} jobs; swept: {', '.join(swept) or 'nothing'}.", "",
             f"![metrics over rollout_id: mean ± std over {', '.join(over) or 'jobs'}]({plot.name})", ""] + table
    data["bands"] = [{"group": c.label, "key": c.key, "panel": plotted[c.panel][0].title, "jobs": c.members,
                      **asdict(c.band)} for c in curves if c.band is not None]
    return lines, data, plot


def write_report(path: str | Path, out_dir: str | Path | None = None, over: list[str] | None = None,
                 title: str | None = None, metrics: list[str] | None = None) -> dict[str, Any]:
    """Write the report of the run or sweep at `path` into `out_dir` (default `<path>/report`).

    `metrics`: globs of extra numeric keys to plot and tabulate (default
    `panels.DEFAULT_METRICS`). Returns {"kind", "markdown", "plots", "json"} with the written
    paths. Raises `NoMetricsError` when `path` holds no metrics.jsonl, `UnknownMetricError`
    when a pattern matches no numeric key.
    """
    path = Path(path)
    kind, runs = find_runs(path)
    if not any(run.rows for run in runs):
        raise NoMetricsError(f"{path}: metrics.jsonl has no rollout yet (the run stopped before rollout 0 ended)")
    panels = select_panels(runs, metrics)
    out = Path(out_dir) if out_dir is not None else path / "report"
    title = title or f"{kind} {path.resolve().name}"
    plotted, hidden, merged = _plotted(runs, panels)
    if kind == "run":
        lines, data, plot = _run_report(runs[0], panels, plotted, out, title)
    else:
        lines, data, plot = _sweep_report(runs, panels, plotted, out, title, over)
    # under the plot: both kinds start with title, summary and image (6 lines)
    lines[6:6] = _notice_lines(hidden, merged)
    data["kind"] = kind
    data["panels"] = [{"title": p.title, "keys": keys} for p, keys in panels]
    data["plotted"] = [p.title for p, _ in plotted]
    data["constant"] = {plotted[i][0].title: v for i, v in _flat(runs, plotted).items()}
    md = out / "report.md"
    _write_text(md, "\n".join(lines) + "\n")
    js = out / "report.json"
    _write_text(js, json.dumps(data, indent=1, default=str))
    logger.debug("report: %s", md)
    return {"kind": kind, "markdown": md, "plots": [plot], "json": js}
