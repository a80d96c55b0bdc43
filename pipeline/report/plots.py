"""PNG plots (matplotlib, Agg backend): a grid of panels over rollout_id, drawn from `Curve`s."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pipeline.process.atomic import atomic_write_bytes  # noqa: E402
from pipeline.report.curves import MARKERS, Curve, band_limits  # noqa: E402
from pipeline.report.panels import Panel  # noqa: E402
from pipeline.report.shape import flat_ylim  # noqa: E402

__all__ = ["plot_curves"]


def _key_legend(ax: plt.Axes, panel: Panel, keys: list[str], curves: list[Curve], sweep: bool) -> None:
    """A panel with several keys: which line is which key (a sweep: line styles in grey), in a
    strip above the data (the y range grows to make room, so the legend hides no point)."""
    drawn = [k for k in keys if any(c.key == k for c in curves)]
    if sweep:
        style = {c.key: c.style for c in curves}
        handles = [Line2D([], [], color="0.3", linestyle=style[k], linewidth=1.6) for k in drawn]
    else:
        line_of = {line.get_label(): line for line in ax.get_lines()}
        handles = [line_of[panel.label(k)] for k in drawn]
    ncol = min(3, len(drawn))
    rows = -(-len(drawn) // ncol)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + (hi - lo) * 0.13 * rows)
    ax.legend(handles, [panel.label(k) for k in drawn], fontsize=7, loc="upper center", ncol=ncol, framealpha=0.8,
              handlelength=2.5, columnspacing=1.0)


def plot_curves(panels: list[tuple[Panel, list[str]]], curves: list[Curve], path: Path, title: str,
                groups: list[str] | None = None, flat: dict[int, float] | None = None) -> Path:
    """Draw `curves` into a grid of `panels`, one PNG at `path` (atomically); returns it.

    `groups` (a sweep) names the colour/marker of each group in a figure legend; without it
    (one run) panels with several keys get their own legend. `flat`: panel index -> the value
    of a constant panel, drawn flat in `shape.flat_ylim` instead of autoscaled.
    """
    flat = flat or {}
    if not panels:
        raise ValueError(f"{title}: no plotted metric is in metrics.jsonl")
    ncols = 3 if len(panels) > 4 else 2
    nrows = -(-len(panels) // ncols)
    # constrained layout keeps the title, the panel titles and the figure legend apart at any size
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.5 * nrows + 1.1), squeeze=False,
                             layout="constrained")
    cmap = plt.get_cmap("tab10")
    for pi, (ax, (panel, keys)) in enumerate(zip(axes.flat, panels)):
        mine = [c for c in curves if c.panel == pi]
        for c in mine:
            colour = cmap(c.colour % 10)
            if c.band is not None:
                lo, hi = band_limits(c.band, panel.fraction)
                ax.fill_between(c.xs, lo, hi, color=colour, alpha=0.15, linewidth=0)
            if c.thin:
                ax.plot(c.xs, c.ys, c.style, color=colour, alpha=0.35, linewidth=0.8)
            else:
                ax.plot(c.xs, c.ys, c.style, color=colour, marker=c.marker or None, markersize=4.5,
                        linewidth=1.8, label=c.label, markerfacecolor="none" if c.style != "-" else colour)
        ax.set_title(panel.title, fontsize=11)
        ax.set_xlabel("rollout_id")
        ax.set_ylabel(panel.ylabel, fontsize=8.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if pi in flat:
            ax.set_ylim(*flat_ylim(flat[pi], panel.fraction))
            ax.text(0.02, 0.04, "constant", transform=ax.transAxes, fontsize=8, color="0.4")
        if len(keys) > 1 and mine:
            _key_legend(ax, panel, keys, mine, sweep=groups is not None)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=12)
    if groups:
        handles = [Line2D([], [], color=cmap(i % 10), marker=MARKERS[i % len(MARKERS)], linewidth=1.8)
                   for i in range(len(groups))]
        fig.legend(handles, groups, loc="outside lower center", ncol=min(3, len(groups)), fontsize=9, frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
