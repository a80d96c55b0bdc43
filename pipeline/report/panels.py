"""What the report shows: one panel per quantity, and the keys in metrics.jsonl that feed it."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.report.load import RunData

__all__ = ["PANELS", "Panel", "panel_keys"]


@dataclass(frozen=True)
class Panel:
    """A quantity over rollout_id: `keys` are the metric keys drawn (those present in a run)."""

    title: str
    ylabel: str
    keys: tuple[str, ...]
    # short column name in the Markdown tables
    column: str
    # a key prefix + suffix whose matches are drawn too (eval pass rates); "" for none
    match_prefix: str = ""
    match_suffix: str = ""


PANELS: tuple[Panel, ...] = (
    Panel("Reward", "mean raw reward per sample", ("rollout/raw_reward",), "reward"),
    Panel("Pass rate", "fraction of samples with reward > 0", ("rollout/pass_rate", "report/pass_rate"), "pass rate",
          match_prefix="eval/", match_suffix="-pass@1"),
    Panel("Response length", "mean response length (tokens)", ("rollout/response_len/mean",), "response len"),
    Panel("Dynamic-filter drops", "groups dropped per rollout", ("rollout/groups_dropped",), "groups dropped"),
    Panel("Buffer size", "groups in the buffer after the rollout", ("rollout/buffer_size",), "buffer"),
    Panel("Rollout time", "seconds per rollout", ("perf/rollout_time",), "time (s)"),
)


def panel_keys(panel: Panel, runs: list[RunData]) -> list[str]:
    """The keys of `panel` that some run logged, fixed keys first, then matched eval keys sorted."""
    present = set().union(*(r.keys() for r in runs)) if runs else set()
    keys = [k for k in panel.keys if k in present]
    if panel.match_prefix:
        keys += sorted(k for k in present
                       if k.startswith(panel.match_prefix) and k.endswith(panel.match_suffix) and k not in keys)
    return keys
