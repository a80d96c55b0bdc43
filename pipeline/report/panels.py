"""What the report shows: one panel per quantity, and the keys in metrics.jsonl that feed it.

Fixed panels (`PANELS`) come first, in order; then one panel per eval set (`eval/<name>`,
`eval/<name>-pass@k`), then one panel per key matched by the custom patterns (`--metrics`,
shell-style globs such as `'rollout/my_*'`; default `DEFAULT_METRICS`). A panel is shown
only when some run logged one of its keys.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from dataclasses import dataclass

from pipeline.report.derived import ZERO_STD_FRACTION, ZERO_STD_FRACTION_GENERATED
from pipeline.report.load import RunData

__all__ = ["DEFAULT_METRICS", "PANELS", "Panel", "UnknownMetricError", "all_zero", "eval_sets", "numeric_keys",
           "panel_keys", "select_panels"]

# custom metrics shown when no --metrics pattern is given: throughput, the trainer's train/...
# metrics (a run with trainer=policy_gradient: loss, grad_norm, lr, ...) and an eval function's
# own eval/... metrics that are not part of an eval set's panel
DEFAULT_METRICS: tuple[str, ...] = ("perf/tokens_per_sec", "train/*", "eval/*")

# most custom-metric panels in one report (more would make the plot unreadable)
MAX_CUSTOM_PANELS = 24

logger = logging.getLogger(__name__)

_EVAL_SUFFIX = re.compile(r"-(truncated_ratio|pass@\d+)$")


class UnknownMetricError(ValueError):
    """A `--metrics` pattern matched no numeric key of any run."""


@dataclass(frozen=True)
class Panel:
    """A quantity over rollout_id: `keys` are the metric keys drawn (those present in a run).

    `key_labels` names a key in legends (default: the key itself); `column` is the short column
    name in the Markdown tables (the panel's first present key fills it).
    """

    title: str
    ylabel: str
    keys: tuple[str, ...]
    column: str
    key_labels: tuple[tuple[str, str], ...] = ()
    # a key glob whose matches (not already in keys) are drawn too, sorted; "" for none
    match: str = ""
    # how the table column is computed, printed under the tables; "" for none
    note: str = ""
    # a fraction: bands are drawn no higher than 1
    fraction: bool = False
    # left out of the plot (still in the tables) when every value of every run is 0
    hide_if_zero: bool = False

    def label(self, key: str) -> str:
        """The legend name of `key` in this panel (an eval key: `eval <set>`)."""
        if key in dict(self.key_labels):
            return dict(self.key_labels)[key]
        return f"eval {eval_sets([key])[0]}" if key.startswith("eval/") and eval_sets([key]) else key


PANELS: tuple[Panel, ...] = (
    Panel("Reward", "mean raw reward per sample", ("rollout/raw_reward",), "reward"),
    Panel("Pass rate (train)", "fraction of samples with reward > 0", ("rollout/pass_rate", "report/pass_rate"),
          "pass rate", fraction=True),
    Panel("Truncated ratio", "fraction of samples cut at max length", ("rollout/truncated_ratio",), "truncated",
          key_labels=(("rollout/truncated_ratio", "train"),), match="eval/*-truncated_ratio",
          note="truncated: fraction of train samples that hit the response-length limit (rollout/truncated_ratio)",
          fraction=True),
    # the table column shows the fraction before the dynamic filter where one dropped zero-std groups
    Panel("Zero-std groups", "fraction of groups, all rewards equal", (ZERO_STD_FRACTION_GENERATED, ZERO_STD_FRACTION),
          "zero-std", key_labels=((ZERO_STD_FRACTION_GENERATED, "before the dynamic filter"),
                                  (ZERO_STD_FRACTION, "in the train batch")),
          note="zero-std: groups whose rewards all agree / groups, from rollout/zero_std/count_* and "
               "rollout/num_samples / n_samples_per_prompt; where the dynamic filter dropped such groups, counted "
               "before the filter (its drops added to both), else in the train batch", fraction=True),
    Panel("Response length", "mean response length (tokens)", ("rollout/response_len/mean",), "response len"),
    Panel("Dynamic-filter drops", "groups dropped per rollout", ("rollout/groups_dropped",), "groups dropped",
          hide_if_zero=True),
    Panel("Buffer size", "groups in the buffer after the rollout", ("rollout/buffer_size",), "buffer",
          hide_if_zero=True),
    Panel("Rollout time", "seconds per rollout", ("perf/rollout_time",), "time (s)"),
    # the agent loop (rollout.generate=agent): shown when its agent/* metrics were logged
    Panel("Agent turns", "model turns per sample", ("agent/turns_mean",), "turns"),
    Panel("Tool calls", "calls per rollout", ("agent/tool_calls", "agent/malformed_calls", "agent/tool_errors"),
          "tool calls", key_labels=(("agent/tool_calls", "run"), ("agent/malformed_calls", "malformed"),
                                    ("agent/tool_errors", "tool errors"))),
    Panel("Tool latency", "seconds per call", ("agent/tool_latency_mean_s", "agent/tool_latency_p95_s"),
          "tool latency (s)", key_labels=(("agent/tool_latency_mean_s", "mean"), ("agent/tool_latency_p95_s", "p95"))),
    Panel("Tool-output tokens", "share of response tokens", ("agent/tool_token_share",), "tool tokens",
          fraction=True),
)


def _present(runs: list[RunData]) -> set[str]:
    return set().union(*(r.keys() for r in runs)) if runs else set()


def numeric_keys(runs: list[RunData]) -> list[str]:
    """Every key that holds a finite number in some row of some run, sorted."""
    return sorted(k for k in _present(runs) if any(v is not None for r in runs for v in r.series(k)))


def panel_keys(panel: Panel, runs: list[RunData]) -> list[str]:
    """The keys of `panel` that some run logged, fixed keys first, then matched keys sorted."""
    present = _present(runs)
    keys = [k for k in panel.keys if k in present]
    if panel.match:
        keys += sorted(k for k in present if fnmatch.fnmatchcase(k, panel.match) and k not in keys)
    return keys


def all_zero(runs: list[RunData], keys: list[str]) -> bool:
    """Every logged value of `keys` in every run is 0 (e.g. no drops without a dynamic filter)."""
    return all(v in (None, 0.0) for r in runs for k in keys for v in r.series(k))


def eval_sets(keys: list[str] | set[str]) -> list[str]:
    """Eval set names of `eval/<name>-pass@k` and `eval/<name>-truncated_ratio` keys (other
    `eval/...` keys, e.g. an eval function's own metrics, are not sets)."""
    names = {_EVAL_SUFFIX.sub("", k[len("eval/"):]) for k in keys
             if k.startswith("eval/") and _EVAL_SUFFIX.search(k)}
    return sorted(n for n in names if n)


def _k(key: str) -> int:
    return int(key.rsplit("@", 1)[1])


def _same_series(runs: list[RunData], a: str, b: str) -> bool:
    return all(r.series(a) == r.series(b) for r in runs)


def _eval_panel(name: str, runs: list[RunData], present: set[str]) -> Panel:
    """eval/<name>-pass@k for each logged k (ascending), then the mean reward eval/<name> unless
    it equals pass@1 everywhere (0/1 rewards), which the pass@1 label then says."""
    prefix = f"eval/{name}-pass@"
    passes = sorted((k for k in present if k.startswith(prefix) and k[len(prefix):].isdigit()), key=_k)
    labels = [(k, f"pass@{_k(k)}") for k in passes]
    mean, pass1 = f"eval/{name}", f"eval/{name}-pass@1"
    keys = list(passes)
    if mean in present and pass1 in present and _same_series(runs, mean, pass1):
        labels[0] = (pass1, "pass@1 (= mean reward)")
    elif mean in present:
        keys.append(mean)
        labels.append((mean, "mean reward"))
    column = f"eval {name} " + dict(labels).get(keys[0], "").split(" ")[0] if keys else f"eval {name}"
    return Panel(f"Eval: {name}", "pass@k / mean reward over eval prompts", tuple(keys), column.strip(),
                 key_labels=tuple(labels), note=f"{column.strip()}: {keys[0] if keys else ''}, only at eval steps "
                 "(pass@k: unbiased estimate from n_samples_per_eval_prompt samples per prompt)",
                 fraction=mean not in keys)


def select_panels(runs: list[RunData], metrics: list[str] | None = None) -> list[tuple[Panel, list[str]]]:
    """(panel, present keys) for every panel with data: fixed, eval sets, custom patterns.

    `metrics` are globs over numeric keys (default `DEFAULT_METRICS`); a key already drawn by
    an earlier panel is not repeated. A given pattern that matches nothing raises
    `UnknownMetricError` listing the numeric keys there are.
    """
    present = _present(runs)
    out = [(p, panel_keys(p, runs)) for p in PANELS]
    for name in eval_sets(present):
        panel = _eval_panel(name, runs, present)
        out.append((panel, list(panel.keys)))
    out = [(p, keys) for p, keys in out if keys]
    # an eval set's mean reward counts as shown when its pass@1 stands for it
    shown = {k for _, keys in out for k in keys} | {f"eval/{name}" for name in eval_sets(present)}
    numeric = numeric_keys(runs)
    patterns = list(DEFAULT_METRICS) if metrics is None else metrics
    custom: list[str] = []
    for pattern in patterns:
        matched = [k for k in numeric if fnmatch.fnmatchcase(k, pattern)]
        if not matched and metrics is not None:
            raise UnknownMetricError(
                f"--metrics {pattern!r} matches no numeric key in metrics.jsonl; there are: {', '.join(numeric)}")
        for key in matched:
            if key not in shown:
                shown.add(key)
                custom.append(key)
    if len(custom) > MAX_CUSTOM_PANELS:
        logger.warning("--metrics: %d keys match; plotting the first %d, leaving out %s (narrow the pattern)",
                       len(custom), MAX_CUSTOM_PANELS, ", ".join(custom[MAX_CUSTOM_PANELS:]))
    out += [(Panel(key, key.rsplit("/", 1)[-1], (key,), key), [key]) for key in custom[:MAX_CUSTOM_PANELS]]
    return out
