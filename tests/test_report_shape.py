"""pipeline/report/shape.py on its own (fast, for mutation testing): which series count as
constant, the y range of a flat panel, and which panels fold into one."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.report.load import RunData
from pipeline.report.panels import Panel
from pipeline.report.shape import CONSTANT_RTOL, constant_value, flat_ylim, merge_identical


def _run(**series: list[float | None]) -> RunData:
    steps = max(len(v) for v in series.values())
    rows = [{"step": i, **{k: v[i] for k, v in series.items() if i < len(v) and v[i] is not None}}
            for i in range(steps)]
    return RunData(Path("."), "r", rows=rows)


def _panel(title: str, fraction: bool = False) -> Panel:
    return Panel(title=title, ylabel="", keys=(title,), column=title, fraction=fraction)


def test_constant_value_is_the_midpoint_within_the_tolerance():
    assert CONSTANT_RTOL == 1e-6
    assert constant_value([_run(k=[2.0, 2.0 * (1 + 1e-6)])], ["k"]) == pytest.approx(2.000001)
    assert constant_value([_run(k=[2.0, 2.0 * (1 + 3e-6)])], ["k"]) is None, "just outside"
    assert constant_value([_run(k=[-2.0, -2.0])], ["k"]) == -2.0, "negative values count by magnitude"
    assert constant_value([_run(k=[0.0, 0.0])], ["k"]) == 0.0
    assert constant_value([_run(a=[1.0, 1.0], b=[1.0, 1.0])], ["a", "b"]) == 1.0, "over every key"
    assert constant_value([_run(a=[1.0, 1.0], b=[1.0, 3.0])], ["a", "b"]) is None
    assert constant_value([_run(k=[None, 4.0])], ["k"]) is None, "one logged point is not a series"
    assert constant_value([_run(k=[4.0]), _run(k=[4.0])], ["k"]) == 4.0, "points of every run together"


def test_flat_ylim():
    assert flat_ylim(2.0, fraction=False) == pytest.approx((1.8, 2.2))
    assert flat_ylim(-2.0, fraction=True) == pytest.approx((-2.2, -1.8))
    assert flat_ylim(0.0, fraction=False) == (-1.0, 1.0)
    assert flat_ylim(0.0, fraction=True) == (-0.1, 0.1)


def test_equal_varying_series_fold_into_the_first_panel():
    runs = [_run(A=[0.1, 0.5], B=[0.1, 0.5], C=[0.1, 0.6], D=[0.1, 0.5]),
            _run(A=[0.2, 0.3], B=[0.2, 0.3], C=[0.2, 0.3], D=[0.2, 0.3])]
    panels = [(_panel("A"), ["A"]), (_panel("B", fraction=True), ["B"]), (_panel("C"), ["C"]), (_panel("D"), ["D"])]
    out, merged = merge_identical(runs, panels)
    assert [(p.title, keys) for p, keys in out] == [("A = B = D", ["A"]), ("C", ["C"])]
    assert merged == ["A = B = D"]
    assert out[0][0].fraction, "a fraction if either was"
    assert out[1][0].fraction is False


def test_constant_empty_and_differently_shaped_panels_stay_apart():
    runs = [_run(A=[1.0, 1.0], B=[1.0, 1.0], C=[0.1, 0.5], D=[0.1, 0.5], E=[0.1, 0.5])]
    panels = [(_panel("A"), ["A"]), (_panel("B"), ["B"]), (_panel("X"), ["X"]), (_panel("Y"), ["Y"]),
              (_panel("C"), ["C"]), (_panel("DE"), ["D", "E"])]
    out, merged = merge_identical(runs, panels)
    assert [p.title for p, _ in out] == ["A", "B", "X", "Y", "C", "DE"] and merged == []
    # the same values at other steps are other series
    shifted = [_run(A=[None, 0.1, 0.5], B=[0.1, 0.5])]
    assert [p.title for p, _ in merge_identical(shifted, [(_panel("A"), ["A"]), (_panel("B"), ["B"])])[0]] == ["A", "B"]
