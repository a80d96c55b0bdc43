"""metrics.jsonl (always written, one object per step with "step") and a console logger sink."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from pipeline.process.atomic import atomic_write_text

__all__ = ["ConsoleSink", "MetricsJsonl", "clean_value", "read_metrics"]

logger = logging.getLogger(__name__)


def clean_value(value: Any) -> Any:
    """JSON-safe scalar: NaN/inf become None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsJsonl:
    """Appends `{"step": step, **metrics}` lines to `<run>/metrics.jsonl`, flushed per step."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def truncate_from(self, step: int) -> None:
        """Drop lines with step >= `step` (a resumed run rewrites the steps it redoes)."""
        if not self.path.exists():
            return
        kept = [r for r in read_metrics(self.path) if r["step"] < step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one line for `step`."""
        row = {"step": int(step), **{k: clean_value(v) for k, v in metrics.items()}}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl; a line that is not a JSON object with "step" is an error."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or "step" not in row:
                raise ValueError(f"{path}:{lineno}: expected a JSON object with 'step'")
            rows.append(row)
    return rows


class ConsoleSink:
    """The `logger=jsonl` choice: no external service; one log line per step."""

    def __init__(self, *, keys: list[str] | None) -> None:
        # metric keys shown per step (None: every key); conf/logger/jsonl.yaml sets them
        self.keys = keys

    def start(self, **_: Any) -> None:
        """Nothing to open."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Log the selected metrics at INFO."""
        shown = {k: v for k, v in metrics.items() if self.keys is None or k in self.keys}
        logger.info("step %d: %s", step, ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(shown.items())))

    def finish(self, exit_code: int = 0) -> None:
        """Nothing to close."""
