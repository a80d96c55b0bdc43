"""PNG plots (matplotlib, Agg backend): a grid of panels over rollout_id, one curve per run."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pipeline.report.load import RunData  # noqa: E402
from pipeline.report.panels import PANELS, panel_keys  # noqa: E402
from pipeline.atomic import atomic_write_bytes  # noqa: E402

__all__ = ["plot_runs"]

_STYLES = ("-", "--", ":", "-.")


def _label(key: str) -> str:
    return {"report/pass_rate": "train (reward > 0)", "rollout/pass_rate": "train (reward > 0)"}.get(key, key)


def plot_runs(runs: list[RunData], path: Path, title: str, colour_of: dict[str, int] | None = None,
              style_of: dict[str, int] | None = None, labels: dict[str, str] | None = None) -> Path:
    """Draw every panel with data for `runs` into one PNG at `path` (atomically); returns it.

    `colour_of` / `style_of` map a run name to a colour / line-style index (a sweep colours by
    group and styles by seed), default: one colour per run; `labels` names runs in the legend.
    """
    panels = [(p, panel_keys(p, runs)) for p in PANELS]
    panels = [(p, keys) for p, keys in panels if keys]
    if not panels:
        raise ValueError(f"{title}: none of the plotted metrics ({', '.join(k for p in PANELS for k in p.keys)}) "
                         "is in metrics.jsonl")
    ncols = 3 if len(panels) > 4 else 2
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows + 0.9), squeeze=False)
    cmap = plt.get_cmap("tab10")
    handles: dict[str, object] = {}
    for ax, (panel, keys) in zip(axes.flat, panels):
        for i, run in enumerate(runs):
            colour = cmap((colour_of or {}).get(run.name, i) % 10)
            for j, key in enumerate(keys):
                ys = run.series(key)
                pts = [(s, y) for s, y in zip(run.steps(), ys) if y is not None]
                if not pts:
                    continue
                style = _STYLES[((style_of or {}).get(run.name, 0) + j) % len(_STYLES)]
                name = (labels or {}).get(run.name, run.name)
                label = name if len(keys) == 1 else f"{name}: {_label(key)}"
                (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=colour,
                                  marker="o", markersize=3.5, linewidth=1.6, label=label)
                handles.setdefault(label, line)
        ax.set_title(panel.title)
        ax.set_xlabel("rollout_id")
        ax.set_ylabel(panel.ylabel, fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(keys) > 1 and len(runs) == 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=13)
    if len(runs) > 1:
        ncol = min(3, len(handles))
        fig.legend(list(handles.values()), list(handles.keys()), loc="lower center", ncol=ncol, fontsize=8,
                   frameon=False)
        rows = -(-len(handles) // ncol)
        fig.tight_layout(rect=(0, min(0.4, 0.03 + 0.035 * rows), 1, 0.97))
    else:
        fig.tight_layout(rect=(0, 0, 1, 0.97))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
