"""Learning benchmark (`make bench-learn`; not in CI): does `experiment=learn` lift held-out greedy
pass@1 on data/math_eval.jsonl to the target within the time budget, for each seed?

Runs `python run.py -m experiment=learn data_source.seed=<seeds> [overrides]` (one sweep, jobs
one after the other; or reads a finished sweep dir with --from), then reports per job: pass@1 at
rollout 0, the first eval at or above --target with its wall-clock minutes since the job started,
the best pass@1 within --minutes, and the median seconds per step split into generation
(perf/rollout_time), training (perf/train_time) and the rest; and writes the sweep report
(`python -m pipeline.report`, mean and spread over the seeds) with its PNG.

Wall clock comes from the job's run.log: its first line is written when the job starts (before
the model loads), each eval line when that eval ends.

`--against OTHER_SWEEP` asks whether this sweep learns as another one does (say 2 trainer workers
against 1, each over the same seeds): `spread_test` compares the two sets of eval curves (the
rollouts after 0 that both have) by the mean difference of pass@1, with an exact permutation test
over the runs (which runs are called "this sweep" is shuffled, whole curves at a time), and counts
this sweep's values below the lowest / above the highest of the other's at the same rollout,
against the count a shuffle of the same runs gives.

Usage: python bench/learn.py [--seeds 1,2,3] [--minutes 15] [--target 0.8] [--from SWEEP_DIR]
       [--against OTHER_SWEEP_DIR] [-- extra overrides ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
_EVAL = re.compile(r"===== eval at rollout (\d+) =====")


def log_time(line: str) -> datetime | None:
    """The time stamp at the start of a run.log line (local time, naive), or None."""
    match = _STAMP.match(line)
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f") if match else None


def eval_times(run_log: Path) -> dict[int, float]:
    """rollout_id -> seconds from the job's first log line to the end of that eval (the next
    stamped line after the eval header, i.e. when its metrics were printed)."""
    lines = run_log.read_text().splitlines()
    start = next(t for t in map(log_time, lines) if t is not None)
    out: dict[int, float] = {}
    pending: int | None = None
    for line in lines:
        header = _EVAL.search(line)
        if header:
            pending = int(header.group(1))
            continue
        stamp = log_time(line)
        if pending is not None and stamp is not None:
            out[pending] = (stamp - start).total_seconds()
            pending = None
    if pending is not None:  # the eval was the log's last entry: its header time is a lower bound
        last = [t for t in map(log_time, lines) if t is not None][-1]
        out[pending] = (last - start).total_seconds()
    return out


def job_summary(job: Path, minutes: float, target: float, key: str) -> dict[str, Any]:
    """One job's numbers (module docstring)."""
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = {int(r["step"]): float(r[key]) for r in rows if key in r}
    times = eval_times(job / "run.log")
    within = {step: value for step, value in evals.items() if times.get(step, float("inf")) <= minutes * 60}
    reached = sorted(step for step, value in evals.items() if value >= target)
    gen = [r["perf/rollout_time"] for r in rows if "perf/rollout_time" in r]
    train = [r["perf/train_time"] for r in rows if "perf/train_time" in r]
    stage_total = [sum(v for k, v in r.items() if k.startswith("perf/stage/") and k.endswith("_time"))
                   for r in rows]
    first = reached[0] if reached else None
    return {
        "job": job.name, "overrides": _overrides(job),
        "pass@1 at rollout 0": evals.get(0), "best within budget": max(within.values()) if within else None,
        "first rollout at target": first, "minutes to target": None if first is None else times[first] / 60,
        "final pass@1": evals[max(evals)] if evals else None, "rollouts": len(rows),
        "s/step generation": statistics.median(gen) if gen else None,
        "s/step training": statistics.median(train) if train else None,
        "s/step all stages": statistics.median(stage_total) if stage_total else None,
        "curve": [(step, evals[step], round(times.get(step, float("nan")) / 60, 2)) for step in sorted(evals)],
    }


def _overrides(job: Path) -> list[str]:
    """The job's command-line overrides (Hydra's .hydra/overrides.yaml)."""
    import yaml

    path = job / ".hydra" / "overrides.yaml"
    return [str(o) for o in (yaml.safe_load(path.read_text()) or [])] if path.exists() else []


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "not reached"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(summaries: list[dict[str, Any]], minutes: float, target: float) -> str:
    """The Markdown table of the jobs."""
    head = (f"| job | overrides | pass@1 at rollout 0 | first eval ≥ {target} (rollout; minutes) | "
            f"best pass@1 within {minutes:g} min | s/step: generation / training / all stages |")
    lines = [head, "|---|---|---|---|---|---|"]
    for s in summaries:
        reached = ("not reached" if s["first rollout at target"] is None
                   else f"{s['first rollout at target']}; {s['minutes to target']:.1f}")
        lines.append(f"| {s['job']} | {' '.join(o for o in s['overrides'] if 'experiment' not in o)} | "
                     f"{_fmt(s['pass@1 at rollout 0'], 3)} | {reached} | {_fmt(s['best within budget'], 3)} | "
                     f"{_fmt(s['s/step generation'], 1)} / {_fmt(s['s/step training'], 1)} / "
                     f"{_fmt(s['s/step all stages'], 1)} |")
    return "\n".join(lines)


# at most this many relabellings of the runs are drawn (all of them when there are fewer)
PERMUTATIONS = 20_000


def _outside(these: list[list[float]], others: list[list[float]]) -> tuple[int, int]:
    """How many values of `these` lie below the lowest / above the highest of `others` at the same step."""
    low = [min(c[i] for c in others) for i in range(len(others[0]))]
    high = [max(c[i] for c in others) for i in range(len(others[0]))]
    below = sum(c[i] < low[i] for c in these for i in range(len(low)))
    return below, sum(c[i] > high[i] for c in these for i in range(len(high)))


def _mean_gap(these: list[list[float]], others: list[list[float]]) -> float:
    steps = range(len(others[0]))
    return statistics.mean(statistics.mean(c[i] for c in these) - statistics.mean(c[i] for c in others)
                           for i in steps)


def spread_test(these: dict[str, dict[int, float]], others: dict[str, dict[int, float]]) -> dict[str, Any]:
    """Do the runs `these` (job -> {rollout: pass@1}) learn as the runs `others` do (module docstring)?"""
    steps = sorted(set.intersection(*(set(c) for c in [*these.values(), *others.values()])) - {0})
    if not steps or len(these) < 1 or len(others) < 2:
        raise ValueError(f"spread_test: needs evals after rollout 0 common to every run and 2 or more runs to "
                         f"compare with (got {len(these)} and {len(others)} runs, common rollouts {steps})")
    a = [[c[s] for s in steps] for c in these.values()]
    b = [[c[s] for s in steps] for c in others.values()]
    runs, n = a + b, len(a)
    every = itertools.combinations(range(len(runs)), n)
    picks = list(every) if math.comb(len(runs), n) <= PERMUTATIONS else [
        tuple(random.Random(i).sample(range(len(runs)), n)) for i in range(PERMUTATIONS)]
    gap, (below, above) = _mean_gap(a, b), _outside(a, b)
    gaps, belows = [], []
    for pick in picks:
        x, y = [runs[i] for i in pick], [runs[i] for i in range(len(runs)) if i not in pick]
        gaps.append(_mean_gap(x, y))
        belows.append(_outside(x, y)[0])
    return {"rollouts": steps, "runs": [n, len(b)], "mean gap": gap,
            "p (|gap| at least this)": sum(abs(g) >= abs(gap) - 1e-12 for g in gaps) / len(picks),
            "below the lowest": below, "above the highest": above, "values": n * len(steps),
            "below the lowest, shuffled runs (mean)": statistics.mean(belows),
            "p (as many below)": sum(x >= below for x in belows) / len(picks), "permutations": len(picks)}


_SWEEP_KEY = "hydra.sweep.dir="


def sweep_dir(overrides: list[str]) -> Path:
    """Where the sweep writes: the last `hydra.sweep.dir=` among the overrides (relative to the
    repository, as run.py resolves it), else a new time-stamped dir under outputs/bench_learn."""
    given = [o[len(_SWEEP_KEY):] for o in overrides if o.startswith(_SWEEP_KEY)]
    if given:
        path = Path(given[-1])
        return path if path.is_absolute() else ROOT / path
    return ROOT / "outputs" / "bench_learn" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--key", default="eval/math-pass@1", help="the eval metric")
    parser.add_argument("--from", dest="sweep", default=None, help="a finished sweep dir (no new runs)")
    parser.add_argument("--against", default=None, help="another finished sweep dir to compare the curves with")
    parser.add_argument("overrides", nargs="*", help="more run.py overrides (after --)")
    a = parser.parse_args(argv)
    if a.sweep is None:
        sweep = sweep_dir(a.overrides)
        cmd = [sys.executable, "run.py", "-m", "experiment=learn", f"data_source.seed={a.seeds}",
               f"hydra.sweep.dir={sweep}", *[o for o in a.overrides if not o.startswith(_SWEEP_KEY)]]
        subprocess.run(cmd, check=True, cwd=ROOT)
    else:
        sweep = Path(a.sweep)
    jobs = sorted((p for p in sweep.iterdir() if (p / "metrics.jsonl").exists()), key=lambda p: p.name)
    if not jobs:
        raise SystemExit(f"{sweep}: no job dirs with metrics.jsonl")
    summaries = [job_summary(job, a.minutes, a.target, a.key) for job in jobs]
    from pipeline.report.build import write_report

    report = write_report(sweep, title=f"experiment=learn, seeds {a.seeds}")
    out = sweep / "learn_summary.json"
    out.write_text(json.dumps(summaries, indent=1))
    sys.stdout.write(table(summaries, a.minutes, a.target) + "\n\n")
    for s in summaries:
        sys.stdout.write(f"{s['job']}: (rollout, pass@1, minutes) {s['curve']}\n")
    sys.stdout.write(f"\nreport: {report['markdown']}\nplots: {' '.join(map(str, report['plots']))}\n"
                     f"summary: {out}\n")
    if a.against is not None:
        others = [job_summary(job, a.minutes, a.target, a.key) for job in sorted(
            p for p in Path(a.against).iterdir() if (p / "metrics.jsonl").exists())]
        result = spread_test({s["job"]: {r: v for r, v, _ in s["curve"]} for s in summaries},
                             {s["job"]: {r: v for r, v, _ in s["curve"]} for s in others})
        sys.stdout.write(f"against {a.against}: {json.dumps(result)}\n")
    ok = all(s["best within budget"] is not None and s["best within budget"] >= a.target for s in summaries)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
