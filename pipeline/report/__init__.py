"""The report: `python -m pipeline.report <run or sweep dir>` writes PNG plots and Markdown tables
from `metrics.jsonl` (no wandb account needed) into `<dir>/report/`."""

from pipeline.report.build import write_report
from pipeline.report.load import NoMetricsError, find_runs, load_run
from pipeline.report.panels import UnknownMetricError

__all__ = ["NoMetricsError", "UnknownMetricError", "find_runs", "load_run", "write_report"]
