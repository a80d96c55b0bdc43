"""`python -m pipeline.report`: plots and tables from metrics.jsonl of a run dir or a sweep dir."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.report import NoMetricsError, find_runs, write_report
from pipeline.report.panels import PANELS, panel_keys

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir: Path, rewards: list[float], overrides: list[str] | None = None, pass_rate: bool = True,
              extra: dict | None = None) -> None:
    run_dir.mkdir(parents=True)
    rows = []
    for step, r in enumerate(rewards):
        row = {"step": step, "rollout/raw_reward": r, "rollout/response_len/mean": 10.0 + step,
               "rollout/groups_dropped": step, "rollout/buffer_size": 2.0, "perf/rollout_time": 0.5}
        if pass_rate:
            row["rollout/pass_rate"] = r / 2
        rows.append({**row, **(extra or {})})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if overrides is not None:
        (run_dir / ".hydra").mkdir()
        (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))


def table_rows(md: str, first_cell: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines()
            if line.startswith(f"| {first_cell}")]


def test_run_report_plots_and_table(tmp_path):
    run = tmp_path / "run"
    write_run(run, [0.25, 0.5, 0.75], extra={"eval/gsm-pass@1": 0.3})
    result = write_report(run)
    assert result["kind"] == "run" and result["markdown"] == run / "report" / "report.md"
    png = run / "report" / "run.png"
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 20_000
    md = result["markdown"].read_text()
    assert "| rollout_id | reward | pass rate | response len | groups dropped | buffer | time (s) |" in md
    assert table_rows(md, "2") == [["2", "0.75", "0.375", "12", "2", "2", "0.5"]]
    assert json.loads(result["json"].read_text())["rows"][1]["rollout/raw_reward"] == 0.5
    assert not [p for p in (run / "report").iterdir() if p.name.startswith(".")], "temp files left behind"
    _, runs = find_runs(run)
    pass_panel = next(p for p in PANELS if p.title == "Pass rate")
    assert panel_keys(pass_panel, runs) == ["rollout/pass_rate", "eval/gsm-pass@1"]


def test_pass_rate_from_sample_dumps_for_older_runs(tmp_path):
    run = tmp_path / "old"
    write_run(run, [0.5], pass_rate=False)
    (run / "samples").mkdir()
    samples = [{"reward": 1.0}, {"reward": 0.0}, {"reward": {"acc": 0.5, "fmt": 1}}, {"reward": -1.0}]
    (run / "samples" / "rollout_0.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("reward_key: acc\n")
    _, [data] = find_runs(run)
    assert data.series("report/pass_rate") == [pytest.approx(2 / 4)]


def test_sweep_report_groups_by_the_swept_keys(tmp_path):
    sweep = tmp_path / "sweep"
    finals = {}
    for job, (seed, n) in enumerate([(s, n) for s in (1, 2, 3) for n in (2, 4)]):
        rewards = [0.1 * seed + n / 10, 0.2 * seed]
        write_run(sweep / str(job), rewards, [f"data_source.seed={seed}", f"n_samples_per_prompt={n}", "num_rollout=2"])
        finals.setdefault(n, []).append(statistics.fmean(rewards))
    (sweep / "multirun.yaml").write_text("{}\n")
    result = write_report(sweep)
    assert result["kind"] == "sweep" and (sweep / "report" / "sweep.png").read_bytes()[:8] == PNG
    md = result["markdown"].read_text()
    assert "Grouped by n_samples_per_prompt; ± is the standard deviation over data_source.seed." in md
    for n, values in finals.items():
        [row] = table_rows(md.split("Per job:")[0], str(n) + " ")
        assert row[1] == "3"
        assert row[2] == f"{statistics.fmean(values):.3g} ± {statistics.stdev(values):.2g}"
    data = json.loads(result["json"].read_text())
    assert data["swept"] == ["data_source.seed", "n_samples_per_prompt"] and data["group_by"] == ["n_samples_per_prompt"]
    assert [g["jobs"] for g in data["groups"]] == [["0", "2", "4"], ["1", "3", "5"]]
    # averaging over n_samples_per_prompt instead groups by seed
    write_report(sweep, tmp_path / "by_seed", over=["n_samples_per_prompt"])
    assert "Grouped by data_source.seed" in (tmp_path / "by_seed" / "report.md").read_text()


def test_no_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(NoMetricsError, match="no metrics.jsonl"):
        write_report(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pipeline.report", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "no metrics.jsonl here or in its subfolders" in proc.stderr
    assert not (tmp_path / "report").exists()


def test_bad_metrics_line_names_file_and_line(tmp_path):
    write_run(tmp_path / "r", [0.5])
    with open(tmp_path / "r" / "metrics.jsonl", "a") as fh:
        fh.write("[1, 2]\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: expected a JSON object"):
        write_report(tmp_path / "r")


@pytest.mark.timeout(120)
def test_cli_on_a_real_run(tmp_path):
    run = tmp_path / "smoke"
    subprocess.run([sys.executable, "run.py", "experiment=smoke", f"hydra.run.dir={run}"], cwd=ROOT, check=True,
                   capture_output=True, timeout=100)
    proc = subprocess.run([sys.executable, "-m", "pipeline.report", str(run)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    md = (run / "report" / "report.md").read_text()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        [row] = table_rows(md, f"{m['step']} ")
        assert row[1] == f"{m['rollout/raw_reward']:.3g}" and row[2] == f"{m['rollout/pass_rate']:.3g}"
