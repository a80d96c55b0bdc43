"""Progress bar and end-of-rollout summary for the engine rollout (and eval)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from tqdm import tqdm

__all__ = ["Progress", "format_summary"]

logger = logging.getLogger(__name__)


class Progress:
    """tqdm bar on stderr: samples done, generated tokens/s and the buffer size.

    Shown only when stderr is a terminal: redirected to a file or pipe, a redrawn bar is
    carriage-return junk (the per-rollout progress line of `pipeline.process.logging_setup` stays).
    """

    def __init__(self, total: int, desc: str, enabled: bool, buffer_size: Any = None) -> None:
        show = enabled and _is_terminal(sys.stderr)
        self._bar = tqdm(total=total, desc=desc, file=sys.stderr, disable=not show,
                         unit="sample", dynamic_ncols=True, leave=False)
        self._start = time.perf_counter()
        self._buffer_size = buffer_size

    def update(self, samples: int, tokens: int) -> None:
        """Count `samples` more finished samples; `tokens` is the running total generated."""
        if self._bar.disable:
            return
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        postfix = {"tok/s": f"{tokens / elapsed:.0f}"}
        if self._buffer_size is not None:
            postfix["buffer"] = self._buffer_size()
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(samples)

    def close(self) -> None:
        """Remove the bar."""
        self._bar.close()


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # closed stream
        return False


def format_summary(title: str, metrics: dict[str, Any]) -> str:
    """A compact one-screen block: one `key = value` per line, rollout/* keys shortened."""
    lines = [f"===== {title} ====="]
    for key in sorted(metrics):
        value = metrics[key]
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        lines.append(f"  {key.split('/', 1)[-1] if key.startswith('rollout/') else key:<40} {shown}")
    return "\n".join(lines)
