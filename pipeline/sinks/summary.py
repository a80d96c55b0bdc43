"""The sweep summary: a Markdown table of each job's final metrics, written when a multirun ends."""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from pipeline.process.atomic import atomic_write_text
from pipeline.run.run_record import run_overrides
from pipeline.sinks.jsonl import read_metrics

__all__ = ["SweepSummary", "summarize_sweep"]

logger = logging.getLogger(__name__)

# columns shown when present (others stay in summary.json)
_COLUMNS = ("rollout/raw_reward", "rollout/response_len/mean", "rollout/truncated_ratio",
            "perf/rollout_time", "perf/tokens_per_sec")


def _job_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for metrics in sorted(sweep_dir.glob("*/metrics.jsonl"), key=lambda p: (len(p.parent.name), p.parent.name)):
        job = metrics.parent
        overrides = run_overrides(job)
        steps = read_metrics(metrics)
        final = steps[-1] if steps else {}
        rows.append({"job": job.name, "overrides": overrides, "final_step": final.get("step"),
                     "metrics": {k: v for k, v in final.items() if k != "step"}})
    return rows


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))


def summarize_sweep(sweep_dir: str | Path) -> Path:
    """Write `<sweep>/summary.md` and `<sweep>/summary.json`; returns the Markdown path."""
    sweep_dir = Path(sweep_dir)
    rows = _job_rows(sweep_dir)
    cols = [c for c in _COLUMNS if any(c in r["metrics"] for r in rows)]
    cols += sorted({k for r in rows for k in r["metrics"] if k.startswith("eval/")})
    lines = [f"# Sweep summary: {sweep_dir.name}", "", f"{len(rows)} jobs; final step metrics.", "",
             "| job | overrides | step | " + " | ".join(cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    for r in rows:
        cells = [r["job"], " ".join(r["overrides"]), _fmt(r["final_step"])]
        cells += [_fmt(r["metrics"].get(c)) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    md = sweep_dir / "summary.md"
    atomic_write_text(md, "\n".join(lines) + "\n")
    atomic_write_text(sweep_dir / "summary.json", json.dumps(rows, indent=1))
    return md


class SweepSummary(Callback):
    """Hydra callback: `on_multirun_end` writes the sweep summary."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Summarise every job dir under hydra.sweep.dir."""
        path = summarize_sweep(config.hydra.sweep.dir)
        logger.info("sweep summary: %s; plots: python -m pipeline.report %s", path,
                    shlex.quote(str(config.hydra.sweep.dir)))
