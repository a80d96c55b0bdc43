"""Assemble the report of a run or a sweep dir: plots + report.md + report.json."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pipeline.atomic import atomic_write_bytes
from pipeline.report.load import find_runs
from pipeline.report.plots import plot_runs
from pipeline.report.tables import group_runs, run_table, seed_keys, swept_keys, sweep_tables

__all__ = ["write_report"]

logger = logging.getLogger(__name__)


def _write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_report(path: str | Path, out_dir: str | Path | None = None, over: list[str] | None = None,
                 title: str | None = None) -> dict[str, Any]:
    """Write the report of the run or sweep at `path` into `out_dir` (default `<path>/report`).

    Returns {"kind", "markdown", "plots", "json"} with the written paths. Raises
    `NoMetricsError` when `path` holds no metrics.jsonl.
    """
    path = Path(path)
    kind, runs = find_runs(path)
    out = Path(out_dir) if out_dir is not None else path / "report"
    title = title or f"{kind} {path.resolve().name}"
    if kind == "run":
        run = runs[0]
        plot = plot_runs(runs, out / "run.png", title=f"{title}: metrics over rollout_id")
        lines = [f"# Report: {title}", "", f"{len(run.rows)} rollouts from `{run.path / 'metrics.jsonl'}`.", "",
                 f"![metrics over rollout_id]({plot.name})", ""] + run_table(run)
        data: dict[str, Any] = {"kind": kind, "rows": run.rows}
        plots = [plot]
    else:
        swept = swept_keys(runs)
        over = seed_keys(swept) if over is None else over
        by = [k for k in swept if k not in over]
        colour_of, style_of = {}, {}
        for gi, (_, members) in enumerate(group_runs(runs, by)):
            for si, m in enumerate(members):
                colour_of[m.name], style_of[m.name] = gi, si
        # legend label: job number + the swept values
        labels = {r.name: " ".join([f"job {r.name}:"] + [f"{k.rsplit('.', 1)[-1]}={r.overrides.get(k, '')}"
                                                         for k in swept]) for r in runs}
        plot = plot_runs(runs, out / "sweep.png", title=f"{title}: {len(runs)} jobs, one curve each\n"
                         f"colour: {', '.join(by) or 'job'}; line style: {', '.join(over) or 'job'}",
                         colour_of=colour_of, style_of=style_of, labels=labels)
        table, data = sweep_tables(runs, over)
        lines = [f"# Report: {title}", "", f"{len(runs)} jobs; swept: {', '.join(swept) or 'nothing'}.", "",
                 f"![metrics over rollout_id, one curve per job]({plot.name})", ""] + table
        data["kind"] = kind
        plots = [plot]
    md = out / "report.md"
    _write_text(md, "\n".join(lines) + "\n")
    js = out / "report.json"
    _write_text(js, json.dumps(data, indent=1, default=str))
    logger.debug("report: %s (%d plot(s))", md, len(plots))
    return {"kind": kind, "markdown": md, "plots": plots, "json": js}
