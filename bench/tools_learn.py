"""Tool-use learning benchmark (not in CI): does `experiment=tools` (the calculator through the
agent loop) beat `experiment=tools_direct` (the same questions, no tools) on held-out accuracy
after a fixed wall-clock budget, for each seed; and how does its well-formed-call rate move?

Runs, one after the other, `python run.py experiment=<tools|tools_direct> seed=<s>` for each
seed with a large `num_rollout`; each job gets SIGINT (Ctrl-C: the run stops after the step in
flight, its metrics written) once `--minutes` have passed since it started, model load included.
Or reads finished job dirs with --from. Then reports per job, from its metrics.jsonl and run.log:
held-out accuracy (`eval/tools`, temperature 1, 2 samples per prompt) at rollout 0 and at the
last eval that ended within the budget, and the well-formed-call rate of those evals
(`eval_agent/tool_calls` / (`tool_calls` + `malformed_calls`): calls that parsed and named the
calculator with valid arguments, over all calls the model wrote); mean and sample std over the
seeds of each experiment; and writes the report of all jobs (`python -m pipeline.report`, with
the `eval_agent/*` panels).

Wall clock comes from the job's run.log, as in bench/learn.py.

Usage: python bench/tools_learn.py [--seeds 1,2,3] [--minutes 15] [--experiments tools,tools_direct]
       [--out DIR] [--from DIR] [-- extra overrides ...]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXPERIMENTS = ("tools", "tools_direct")
KEY = "eval/tools"
# after SIGINT a job finishes the step in flight; then it is killed
GRACE_S = 180


@functools.cache
def _learn() -> Any:
    """bench/learn.py (its run.log clock), loaded once."""
    spec = importlib.util.spec_from_file_location("bench_learn", ROOT / "bench" / "learn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def well_formed_rate(row: dict[str, Any]) -> float | None:
    """Calls run / calls written in one eval row; None without any call (or without the agent)."""
    calls, malformed = row.get("eval_agent/tool_calls"), row.get("eval_agent/malformed_calls")
    if calls is None or malformed is None or calls + malformed == 0:
        return None
    return calls / (calls + malformed)


def job_summary(job: Path, minutes: float) -> dict[str, Any]:
    """One job's numbers (module docstring)."""
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = {int(r["step"]): r for r in rows if KEY in r}
    times = _learn().eval_times(job / "run.log")
    within = [step for step in sorted(evals) if times.get(step, float("inf")) <= minutes * 60]
    first, last = (within[0], within[-1]) if within else (None, None)
    return {
        "job": job.name, "rollouts": len(rows),
        "accuracy before": evals[first][KEY] if first is not None else None,
        "accuracy after": evals[last][KEY] if last is not None else None,
        "well-formed before": well_formed_rate(evals[first]) if first is not None else None,
        "well-formed after": well_formed_rate(evals[last]) if last is not None else None,
        "last eval": last, "minutes at last eval": times[last] / 60 if last is not None else None,
        "curve": [(step, round(evals[step][KEY], 4), well_formed_rate(evals[step]),
                   round(times.get(step, float("nan")) / 60, 2)) for step in sorted(evals)],
    }


def _mean_sd(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "–"
    return f"{statistics.mean(got):.3f}" + (f" ± {statistics.stdev(got):.3f}" if len(got) > 1 else "")


def table(summaries: list[dict[str, Any]], minutes: float) -> str:
    """Per job, then mean ± std per experiment (the job name's prefix before `_s<seed>`)."""
    def fmt(v: Any) -> str:
        return "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    lines = [f"| job | held-out accuracy: rollout 0 -> last eval within {minutes:g} min | well-formed calls | "
             "last eval (rollout; minutes) |", "|---|---|---|---|"]
    for s in summaries:
        lines.append(f"| {s['job']} | {fmt(s['accuracy before'])} -> {fmt(s['accuracy after'])} | "
                     f"{fmt(s['well-formed before'])} -> {fmt(s['well-formed after'])} | "
                     f"{fmt(s['last eval'])}; {fmt(s['minutes at last eval'])} |")
    for name in EXPERIMENTS:
        group = [s for s in summaries if s["job"].rsplit("_s", 1)[0] == name]
        if group:
            lines.append(f"| **{name}** (mean ± std, {len(group)} seeds) | "
                         f"{_mean_sd([s['accuracy before'] for s in group])} -> "
                         f"{_mean_sd([s['accuracy after'] for s in group])} | "
                         f"{_mean_sd([s['well-formed before'] for s in group])} -> "
                         f"{_mean_sd([s['well-formed after'] for s in group])} | |")
    return "\n".join(lines)


def plot(summaries: list[dict[str, Any]], path: Path, minutes: float) -> Path:
    """Held-out accuracy and well-formed-call rate against wall-clock minutes, a line per job
    (tools solid, tools_direct dashed; one colour per seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, wf) = plt.subplots(1, 2, figsize=(11, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for s in summaries:
        name, _, seed = s["job"].rpartition("_s")
        style = dict(color=colours[int(seed) % len(colours)] if seed.isdigit() else None,
                     linestyle="-" if name == "tools" else "--", marker="o", label=s["job"])
        acc.plot([c[3] for c in s["curve"]], [c[1] for c in s["curve"]], **style)
        points = [(c[3], c[2]) for c in s["curve"] if c[2] is not None]
        if points:
            wf.plot(*zip(*points), **style)
    for ax, what in ((acc, "held-out accuracy (eval/tools, temperature 1)"),
                     (wf, "well-formed calls / calls written (eval)")):
        ax.set_xlabel("minutes since the job started (model load included)")
        ax.set_title(what)
        ax.set_ylim(-0.02, 1.02)
        ax.axvline(minutes, color="grey", linewidth=0.8)
        ax.grid(alpha=0.3)
    acc.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_job(experiment: str, seed: int, out: Path, minutes: float, overrides: list[str]) -> Path:
    """Run one job until it ends or `minutes` pass (then SIGINT, then a kill after GRACE_S)."""
    job = out / f"{experiment}_s{seed}"
    cmd = [sys.executable, "run.py", f"experiment={experiment}", f"seed={seed}", "num_rollout=200",
           "save_interval=1000", "logger=jsonl", f"hydra.run.dir={job}", *overrides]
    with open(out / f"{job.name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=minutes * 60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS), help="which of them to run")
    parser.add_argument("--out", default=None, help="where the job dirs go (default: outputs/bench_tools/<time>)")
    parser.add_argument("--from", dest="source", default=None, help="a folder of finished job dirs (no new runs)")
    parser.add_argument("overrides", nargs="*", help="more run.py overrides (after --)")
    a = parser.parse_args(argv)
    unknown = [e for e in a.experiments.split(",") if e not in EXPERIMENTS]
    if unknown:
        parser.error(f"--experiments: {unknown} not among {list(EXPERIMENTS)}")
    if a.source is None:
        out = Path(a.out) if a.out else ROOT / "outputs" / "bench_tools" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        out.mkdir(parents=True, exist_ok=True)
        for experiment in a.experiments.split(","):
            for seed in (int(s) for s in a.seeds.split(",")):
                start = time.monotonic()
                run_job(experiment, seed, out, a.minutes, a.overrides)
                sys.stdout.write(f"{experiment} seed {seed}: {time.monotonic() - start:.0f} s\n")
    else:
        out = Path(a.source)
    jobs = sorted((p for p in out.iterdir() if (p / "metrics.jsonl").exists()), key=lambda p: p.name)
    if not jobs:
        raise SystemExit(f"{out}: no job dirs with metrics.jsonl")
    summaries = [job_summary(job, a.minutes) for job in jobs]
    from pipeline.report.build import write_report

    from pipeline.report.panels import DEFAULT_METRICS

    report = write_report(out, title=f"experiment=tools vs tools_direct, seeds {a.seeds}",
                          metrics=[*DEFAULT_METRICS, "eval_agent/tool_calls", "eval_agent/malformed_calls"])
    (out / "tools_summary.json").write_text(json.dumps(summaries, indent=1))
    curves = plot(summaries, out / "tools_curves.png", a.minutes)
    sys.stdout.write(table(summaries, a.minutes) + "\n\n")
    for s in summaries:
        sys.stdout.write(f"{s['job']}: (rollout, accuracy, well-formed, minutes) {s['curve']}\n")
    sys.stdout.write(f"\ncurves: {curves}\nreport: {report['markdown']}\nplots: {' '.join(map(str, report['plots']))}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
