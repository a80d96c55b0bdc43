"""The rollout progress bar: drawn only on a terminal; the summary block."""

from __future__ import annotations

import io
import sys

import pytest

from pipeline.rollout.rollout_report import Progress, format_summary


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.mark.parametrize("tty,enabled,drawn", [(False, True, False), (True, True, True),
                                               (True, False, False)])
def test_bar_only_on_a_terminal(monkeypatch, tty: bool, enabled: bool, drawn: bool) -> None:
    stream = _Stream(tty)
    monkeypatch.setattr(sys, "stderr", stream)
    bar = Progress(4, "rollout 0", enabled, buffer_size=lambda: 3)
    bar.update(2, tokens=100)
    bar.update(2, tokens=200)
    bar.close()
    out = stream.getvalue()
    assert ("\r" in out and "rollout 0" in out) == drawn
    if not drawn:
        assert out == ""


def test_summary_shortens_rollout_keys() -> None:
    text = format_summary("rollout 3", {"rollout/raw_reward": 0.25, "perf/x_time": 1})
    assert text.splitlines()[0] == "===== rollout 3 ====="
    assert any(line.split() == ["raw_reward", "0.25"] for line in text.splitlines())
    assert any(line.split() == ["perf/x_time", "1"] for line in text.splitlines())
