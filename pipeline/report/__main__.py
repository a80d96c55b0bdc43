"""`python -m pipeline.report <run or sweep dir> [--out DIR] [--over KEY ...] [--metrics GLOB ...]`."""

from __future__ import annotations

import argparse
import logging
import sys

from pipeline.report.build import write_report
from pipeline.report.load import NoMetricsError
from pipeline.report.panels import DEFAULT_METRICS, UnknownMetricError

logger = logging.getLogger("pipeline.report")


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, write the report, print where it went; 2 on a dir without metrics
    or a --metrics pattern that matches nothing."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.report", description=(
        "Plots and Markdown tables from metrics.jsonl of a run dir (outputs/runs/<time>) or a sweep "
        "dir (outputs/multirun/<time>); no wandb account needed."))
    parser.add_argument("path", help="a run dir or a sweep dir")
    parser.add_argument("--out", default=None, help="output folder (default: <path>/report)")
    parser.add_argument("--over", action="append", default=None, metavar="KEY",
                        help="sweep: a swept key to average over (repeatable; default: swept keys named *seed*)")
    parser.add_argument("--metrics", action="append", default=None, metavar="GLOB",
                        help="extra numeric keys to plot and tabulate, shell-style glob such as 'rollout/my_*' "
                             f"(repeatable; default: {' '.join(DEFAULT_METRICS)})")
    parser.add_argument("--title", default=None, help="title of the plots and the table")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        result = write_report(ns.path, ns.out, over=ns.over, title=ns.title, metrics=ns.metrics)
    except (NoMetricsError, UnknownMetricError) as exc:
        logger.error("error: %s", exc)
        return 2
    for p in result["plots"]:
        logger.info("plot:  %s", p)
    logger.info("table: %s", result["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
