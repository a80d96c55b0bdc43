"""Console output of a run: one progress line per rollout, a summary table at the end, warnings.

Hydra sends every log record to the console and to `<run dir>/run.log`. `configure_console`
keeps the file complete (INFO and up from every logger) and trims the console to the lines a
user reads while a run goes: the `pipeline.progress` logger at INFO, anything at WARNING and up,
and third-party libraries (Ray, httpx, transformers, urllib3, wandb, ...) at WARNING only
(their download / weight-loading progress bars off).
`hydra.verbose=true` (root logger at DEBUG) turns the trimming off.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import time
from pathlib import Path
from typing import Any

__all__ = ["NOISY_LOGGERS", "PROGRESS_LOGGER", "ConsoleFilter", "RunProgress", "configure_console"]

# libraries whose INFO records are noise on a rollout console (still at WARNING and up)
NOISY_LOGGERS = ("ray", "httpx", "httpcore", "transformers", "urllib3", "wandb", "filelock", "datasets",
                 "huggingface_hub", "asyncio", "accelerate", "fsspec", "matplotlib", "safetensors", "torch")
# the logger whose INFO lines the console shows
PROGRESS_LOGGER = "pipeline.progress"
# name Hydra's job_logging gives its console handler (dictConfig sets handler.name)
_CONSOLE_HANDLER = "console"

progress_logger = logging.getLogger(PROGRESS_LOGGER)


class ConsoleFilter(logging.Filter):
    """Pass WARNING and up from any logger, and INFO from `pipeline.progress`."""

    def filter(self, record: logging.LogRecord) -> bool:
        """True when the record belongs on the console."""
        return record.levelno >= logging.WARNING or record.name.startswith(PROGRESS_LOGGER)


class _RaySignalNotice(logging.Filter):
    """Drops Ray's "SIGTERM handler is not set because current thread is not the main thread"
    (ray.init from a worker thread of ours: the run handles its signals in the main thread)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for Ray's signal-handler notice."""
        return not str(record.msg).startswith("SIGTERM handler is not set")


# the logger Ray's notice comes from (it may not propagate to the root's handlers)
_RAY_WORKER_LOGGER = "ray._private.worker"


class _ConsoleFormatter(logging.Formatter):
    """Progress lines as they are; other records as `WARNING [logger] message`."""

    def format(self, record: logging.LogRecord) -> str:
        if record.name.startswith(PROGRESS_LOGGER) and record.levelno < logging.WARNING:
            return record.getMessage()
        self._style._fmt = "%(levelname)s [%(name)s] %(message)s"
        return super().format(record)


def configure_console() -> None:
    """Quiet third-party loggers; filter and reformat Hydra's console handler (idempotent).

    Handlers other than Hydra's `console` (run.log, pytest's capture) are left alone.
    """
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # transformers' / huggingface_hub's "Loading weights" bars (read when they are imported);
    # HF_HUB_DISABLE_PROGRESS_BARS=0 brings them back
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    ray_worker = logging.getLogger(_RAY_WORKER_LOGGER)
    if not any(isinstance(f, _RaySignalNotice) for f in ray_worker.filters):
        ray_worker.addFilter(_RaySignalNotice())
    root = logging.getLogger()
    if root.getEffectiveLevel() <= logging.DEBUG:
        return
    for handler in root.handlers:
        if handler.get_name() == _CONSOLE_HANDLER and not any(isinstance(f, ConsoleFilter) for f in handler.filters):
            handler.addFilter(ConsoleFilter())
            handler.setFormatter(_ConsoleFormatter())


def _num(metrics: dict[str, Any], key: str) -> float | None:
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _cell(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


# (column header, metric key, format) of the progress line and the summary table
_COLUMNS = (("reward", "rollout/raw_reward", ".3f"), ("pass", "rollout/pass_rate", ".0%"),
            ("len", "rollout/response_len/mean", ".1f"), ("dropped", "rollout/groups_dropped", ".0f"),
            ("buffer", "rollout/buffer_size", ".0f"), ("time s", "perf/rollout_time", ".2f"))


# the trainer's columns, shown when a trainer ran (its train/* metrics are there)
_TRAIN_COLUMNS = (("loss", "train/loss", ".4f"), ("grad norm", "train/grad_norm", ".3f"), ("lr", "train/lr", ".2e"))


# the agent loop's columns (rollout.generate=agent), shown when its agent/* metrics are there: model
# turns per sample, tool calls run, and malformed calls + tool errors
_AGENT_COLUMNS = (("turns", "agent/turns_mean", ".2f"), ("tools", "agent/tool_calls", ".0f"),
                  ("tool errs", "agent/tool_errors", ".0f"))


def _columns(rows: list[dict[str, Any]]) -> tuple[tuple[str, str, str], ...]:
    """The rollout columns, the agent loop's when any of `rows` has agent/* values, then the
    trainer's when any has a train/* value of them."""
    trained = any(_num(m, key) is not None for m in rows for _, key, _ in _TRAIN_COLUMNS)
    agent = any(_num(m, key) is not None for m in rows for _, key, _ in _AGENT_COLUMNS)
    return _COLUMNS + (_AGENT_COLUMNS if agent else ()) + (_TRAIN_COLUMNS if trained else ())


def _value(metrics: dict[str, Any], key: str, spec: str) -> str:
    """One cell; the buffer size shows its traffic, `8 (+6 -4)`: groups that entered the buffer
    (`rollout/groups_to_buffer`) and that it served (`rollout/groups_from_buffer`) this rollout."""
    cell = _cell(_num(metrics, key), spec)
    if key == "agent/tool_errors" and _num(metrics, "agent/malformed_calls") is not None:
        cell = f"{cell}+{_num(metrics, 'agent/malformed_calls'):.0f}"  # tool errors + malformed calls
    if key == "rollout/buffer_size":
        to, served = _num(metrics, "rollout/groups_to_buffer"), _num(metrics, "rollout/groups_from_buffer")
        if to or served:
            cell += f" (+{to or 0:.0f} -{served or 0:.0f})"
    return cell


def _full_log(run_dir: str) -> str:
    """` (full log: <file>)` for the root logger's log file (Hydra's run.log): its name when it is
    in `run_dir`, else its whole path (a sweep job whose paths.output_dir is not Hydra's job dir);
    empty when no file takes the log."""
    files = [Path(h.baseFilename) for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    if not files:
        return ""
    where = files[0].name if files[0].parent.resolve() == Path(run_dir).resolve() else str(files[0])
    return f" (full log: {where})"


# rows of the end-of-run table (the newest rollouts)
_MAX_ROWS = 12


class RunProgress:
    """Logs one line per finished rollout and, at the end, a table of the rollouts of this run."""

    def __init__(self, num_rollout: int, run_dir: str) -> None:
        self.num_rollout = num_rollout
        self.run_dir = run_dir
        self.rows: list[tuple[int, dict[str, Any]]] = []
        self._start = time.perf_counter()

    def step(self, rollout_id: int, metrics: dict[str, Any]) -> None:
        """The progress line of `rollout_id`: the rollout's columns, the trainer's loss, grad norm
        and learning rate when it trained, then eval/<name> values when present."""
        self.rows.append((rollout_id, metrics))
        width = len(str(self.num_rollout - 1))
        parts = [f"rollout {rollout_id:>{width}} of 0..{self.num_rollout - 1}"]
        parts += [f"{name} {_value(metrics, key, fmt)}" for name, key, fmt in _columns([metrics])]
        parts += [f"{k} {v:.3f}" for k, v in sorted(metrics.items())
                  if k.startswith("eval/") and "-" not in k and isinstance(v, float)]
        progress_logger.info(" | ".join(parts))

    def summary(self) -> str:
        """A Markdown-style table of every rollout logged, then the run dir and what to do next."""
        columns = _columns([m for _, m in self.rows])
        header = ["rollout"] + [name for name, _, _ in columns]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        if len(self.rows) > _MAX_ROWS:
            lines.append(f"| ({len(self.rows) - _MAX_ROWS} earlier rollouts: see metrics.jsonl) |" + " |" * len(columns))
        for rollout_id, m in self.rows[-_MAX_ROWS:]:
            lines.append("| " + " | ".join([str(rollout_id)] + [_value(m, k, f) for _, k, f in columns]) + " |")
        rewards = [r for _, m in self.rows if (r := _num(m, "rollout/raw_reward")) is not None]
        mean = f"mean reward {sum(rewards) / len(rewards):.3f}, " if rewards else ""
        lines += ["", f"{len(self.rows)} rollouts, {mean}{time.perf_counter() - self._start:.1f} s. "
                      f"Run dir: {self.run_dir}{_full_log(self.run_dir)}",
                  f"Plots: python -m pipeline.report {shlex.quote(str(self.run_dir))}"]
        if any(Path(self.run_dir, "wandb").glob("offline-run-*")):
            lines.append(f"Upload to wandb: wandb sync {shlex.quote(str(self.run_dir))}/wandb/offline-run-*")
        return "\n".join(lines)
