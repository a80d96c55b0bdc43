"""Reading run dirs and sweep dirs for the report: metrics.jsonl, sample dumps, Hydra overrides."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from pipeline.config.plugins import ConfigError
from pipeline.report.derived import add_zero_std_fractions
from pipeline.run.run_record import read_record, run_overrides
from pipeline.sinks.jsonl import read_metrics

__all__ = ["NoMetricsError", "RunData", "find_runs", "load_run", "pass_rate_from_samples"]


class NoMetricsError(FileNotFoundError):
    """The directory holds neither a run (metrics.jsonl) nor a sweep (<job>/metrics.jsonl)."""


@dataclass
class RunData:
    """One run: its metric rows by step, plus where it came from."""

    path: Path
    name: str
    overrides: dict[str, str] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def steps(self) -> list[int]:
        """The logged rollout ids, in order."""
        return [int(r["step"]) for r in self.rows]

    def series(self, key: str) -> list[float | None]:
        """`key` per step (None where a step lacks it or it is not a finite number)."""
        out: list[float | None] = []
        for row in self.rows:
            v = row.get(key)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            out.append(float(v) if ok else None)
        return out

    def keys(self) -> set[str]:
        """Every metric key of any step."""
        return {k for r in self.rows for k in r if k != "step"}


def _reward_value(reward: Any, reward_key: str | None) -> float | None:
    """A sample's scalar reward (dict rewards: `reward_key`, else their only numeric value)."""
    if isinstance(reward, dict):
        if reward_key is not None and reward_key in reward:
            reward = reward[reward_key]
        else:
            nums = [v for v in reward.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            reward = nums[0] if len(nums) == 1 else None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return None
    return float(reward)


def pass_rate_from_samples(path: Path, reward_key: str | None = None) -> float | None:
    """Fraction of samples in a `samples/rollout_<id>.jsonl` dump with raw reward > 0."""
    rewards = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not a JSON sample line: {exc}") from exc
            value = _reward_value(d.get("reward"), reward_key)
            if value is not None:
                rewards.append(value)
    return sum(r > 0 for r in rewards) / len(rewards) if rewards else None


def _config(run_dir: Path) -> dict[str, Any]:
    """The run's composed config (`.hydra/config.yaml`, unresolved, else the resolved one of its
    record: a sweep job started by a resume keeps its Hydra files in `.hydra/resume-<time>/`)."""
    cfg = run_dir / ".hydra" / "config.yaml"
    if not cfg.exists():
        try:
            return (read_record(run_dir) or {}).get("config") or {}
        except ConfigError:
            return {}
    return OmegaConf.to_container(OmegaConf.load(cfg)) or {}


def _overrides(run_dir: Path) -> dict[str, str]:
    """`key=value` command-line overrides of the run as it stands (its record, which a resume
    updates, else `.hydra/overrides.yaml`); empty when there are none."""
    out = {}
    for item in run_overrides(run_dir):
        key, _, value = item.partition("=")
        out[key.lstrip("+~")] = value
    return out


def load_run(run_dir: str | Path, name: str | None = None) -> RunData:
    """Load `<run_dir>/metrics.jsonl`; runs logged before `rollout/pass_rate` existed get
    `report/pass_rate` computed from their sample dumps; zero-std fractions are derived from
    the logged counts (`add_zero_std_fractions`)."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        raise NoMetricsError(f"{run_dir}: no metrics.jsonl (expected a run dir written by `python run.py`)")
    rows = read_metrics(metrics)
    config = _config(run_dir)
    for row in rows:
        dump = run_dir / "samples" / f"rollout_{row['step']}.jsonl"
        if dump.exists() and "rollout/pass_rate" not in row:
            row["report/pass_rate"] = pass_rate_from_samples(dump, config.get("reward_key"))
    add_zero_std_fractions(rows, config.get("n_samples_per_prompt"))
    return RunData(path=run_dir, name=name or run_dir.name, overrides=_overrides(run_dir), rows=rows)


def _job_order(p: Path) -> tuple[int, str]:
    return (int(p.name), "") if p.name.isdigit() else (1 << 30, p.name)


def find_runs(path: str | Path) -> tuple[str, list[RunData]]:
    """('run', [run]) for a run dir, ('sweep', jobs in job-number order) for a sweep dir."""
    path = Path(path)
    if not path.is_dir():
        raise NoMetricsError(f"{path}: not a directory (expected a run dir or a sweep dir)")
    if (path / "metrics.jsonl").exists():
        return "run", [load_run(path)]
    jobs = sorted((m.parent for m in path.glob("*/metrics.jsonl")), key=_job_order)
    if not jobs:
        raise NoMetricsError(
            f"{path}: no metrics.jsonl here or in its subfolders; expected a run dir "
            "(outputs/runs/<time>) or a sweep dir (outputs/multirun/<time>) written by `python run.py`")
    return "sweep", [load_run(j) for j in jobs]
