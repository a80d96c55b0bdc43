"""bench/tools_learn.py's numbers from a job dir: accuracy and well-formed-call rate at rollout 0
and at the last eval that ended within the budget (by run.log's clock), and the per-experiment
mean ± std."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_tools_learn", ROOT / "bench" / "tools_learn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _job(root: Path, name: str, evals: list[tuple[int, float, int, int, str]]) -> Path:
    """A job dir whose eval at `step` logged (accuracy, calls, malformed) and ended at `clock`."""
    job = root / name
    job.mkdir(parents=True)
    rows, log = [], ["[2026-12-04 03:00:00,000][pipeline.run.app][INFO] - start"]
    for step, acc, calls, malformed, clock in evals:
        rows.append({"step": step, "eval/tools": acc, "eval_agent/tool_calls": calls,
                     "eval_agent/malformed_calls": malformed})
        log += [f"[2026-12-04 {clock},000][pipeline.rollout.eval][INFO] - ===== eval at rollout {step} =====",
                f"[2026-12-04 {clock},500][pipeline.rollout.eval][INFO] -   eval/tools {acc}"]
    (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (job / "run.log").write_text("\n".join(log) + "\n")
    return job


def test_before_and_after_within_the_budget(tmp_path):
    bench = _bench()
    job = _job(tmp_path, "tools_s1", [(0, 0.25, 10, 30, "03:02:00"), (4, 0.75, 40, 10, "03:10:00"),
                                      (9, 0.95, 50, 0, "03:16:00")])
    s = bench.job_summary(job, minutes=15)
    assert (s["accuracy before"], s["accuracy after"], s["last eval"]) == (0.25, 0.75, 4)
    assert (s["well-formed before"], s["well-formed after"]) == (0.25, 0.8)
    assert round(s["minutes at last eval"], 3) == 10.008
    assert bench.job_summary(job, minutes=17)["accuracy after"] == 0.95


def test_no_calls_is_no_rate_and_the_table_averages_per_experiment(tmp_path):
    bench = _bench()
    assert bench.well_formed_rate({"eval_agent/tool_calls": 0, "eval_agent/malformed_calls": 0}) is None
    assert bench.well_formed_rate({"eval/tools": 0.1}) is None
    jobs = [_job(tmp_path, "tools_s1", [(0, 0.2, 1, 1, "03:01:00"), (4, 0.8, 4, 0, "03:05:00")]),
            _job(tmp_path, "tools_s2", [(0, 0.4, 1, 3, "03:01:00"), (4, 0.6, 3, 1, "03:05:00")]),
            _job(tmp_path, "tools_direct_s1", [(0, 0.0, 0, 0, "03:01:00"), (4, 0.05, 0, 0, "03:05:00")])]
    text = bench.table([bench.job_summary(j, 15) for j in jobs], 15)
    assert "| **tools** (mean ± std, 2 seeds) | 0.300 ± 0.141 -> 0.700 ± 0.141 | 0.375 ± 0.177 -> 0.875 ± 0.177 |" in text
    assert "| **tools_direct** (mean ± std, 1 seeds) | 0.000 -> 0.050 | – -> – |" in text
    assert bench.plot([bench.job_summary(j, 15) for j in jobs], tmp_path / "c.png", 15).stat().st_size > 1000


def test_committed_measurement_is_what_the_bench_computes_from_its_jobs():
    """docs/img/tools holds the jobs of the measurement in docs/agent.md; its tools_summary.json is what
    bench/tools_learn.py computes from them (python bench/tools_learn.py --from docs/img/tools/jobs)."""
    bench = _bench()
    docs = ROOT / "docs" / "img" / "tools"
    jobs = sorted(p for p in (docs / "jobs").iterdir() if (p / "metrics.jsonl").exists())
    computed = json.loads(json.dumps([bench.job_summary(job, 15) for job in jobs]))
    assert computed == json.loads((docs / "tools_summary.json").read_text())
    by_job = {s["job"]: s for s in computed}
    assert {"tools_s1", "tools_s2", "tools_s3", "tools_direct_s1"} <= set(by_job)
    # the claim of docs/agent.md and the README: every tools seed beats the baseline by more than 0.2
    assert all(by_job[f"tools_s{k}"]["accuracy after"] - by_job["tools_direct_s1"]["accuracy after"] > 0.2
               for k in (1, 2, 3))
