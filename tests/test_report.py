"""`python -m pipeline.report`: plots and tables from metrics.jsonl of a run dir or a sweep dir."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.report import NoMetricsError, UnknownMetricError, find_runs, write_report
from pipeline.report.curves import Band, band_limits, run_curves, sweep_curves
from pipeline.report.panels import select_panels

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
    write_run(run, [0.25, 0.5, 0.75])
    result = write_report(run)
    assert result["kind"] == "run" and result["markdown"] == run / "report" / "report.md"
    png = run / "report" / "run.png"
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 20_000
    md = result["markdown"].read_text()
    assert ("| rollout_id | reward | pass rate | response len | groups dropped | buffer (constant) "
            "| time (s) (constant) |") in md
    assert table_rows(md, "2") == [["2", "0.75", "0.375", "12", "2", "2", "0.5"]]
    assert json.loads(result["json"].read_text())["rows"][1]["rollout/raw_reward"] == 0.5
    assert not [p for p in (run / "report").iterdir() if p.name.startswith(".")], "temp files left behind"


def test_eval_keys_give_an_eval_panel_per_set_and_table_columns(tmp_path):
    run = tmp_path / "run"
    write_run(run, [0.25, 0.5, 0.75], extra={"rollout/truncated_ratio": 0.25})
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # eval after rollout 1 only (eval_interval=2), two eval sets, k up to 4
    # gsm: partial rewards (mean reward differs from pass@1); aime: 0/1 rewards (they agree)
    rows[1].update({"eval/gsm": 0.35, "eval/gsm-pass@1": 0.4, "eval/gsm-pass@2": 0.6, "eval/gsm-pass@4": 0.7,
                    "eval/gsm-truncated_ratio": 0.1, "eval/aime-2024": 0.05, "eval/aime-2024-pass@1": 0.05,
                    "eval/judge_score": 7.5})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = write_report(run)
    panels = {p["title"]: p["keys"] for p in json.loads(result["json"].read_text())["panels"]}
    assert panels["Eval: gsm"] == ["eval/gsm-pass@1", "eval/gsm-pass@2", "eval/gsm-pass@4", "eval/gsm"]
    assert panels["Eval: aime-2024"] == ["eval/aime-2024-pass@1"], "mean reward = pass@1 is drawn once"
    assert panels["Truncated ratio"] == ["rollout/truncated_ratio", "eval/gsm-truncated_ratio"]
    assert panels["eval/judge_score"] == ["eval/judge_score"], "an eval function's own metric: a panel by default"
    assert not [t for t in panels if "judge" in t and t != "eval/judge_score"]
    [data] = find_runs(run)[1]
    selected = select_panels([data])
    labels = {c.key: c.label for c in run_curves(data, selected)}
    assert labels["eval/aime-2024-pass@1"] == "pass@1 (= mean reward)" and labels["eval/gsm"] == "mean reward"
    assert labels["eval/gsm-truncated_ratio"] == "eval gsm" and labels["rollout/truncated_ratio"] == "train"
    md = result["markdown"].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| rollout_id"))
    assert header.endswith("| truncated (constant) | response len | groups dropped | buffer (constant) "
                           "| time (s) (constant) | eval aime-2024 pass@1 | eval gsm pass@1 | eval/judge_score |")
    assert table_rows(md, "1")[0][-3:] == ["0.05", "0.4", "7.5"]
    assert table_rows(md, "2")[0][-3:] == ["–", "–", "–"], "no eval at rollout 2"
    assert table_rows(md, "2")[0][3] == "0.25"


def test_custom_metrics_chosen_by_glob(tmp_path):
    run = tmp_path / "run"
    write_run(run, [0.5, 0.5], extra={"rollout/my_loss": 1.5, "rollout/my_kl": 0.01, "rollout/other": 3.0,
                                      "rollout/my_note": "text", "perf/tokens_per_sec": 90.0})
    result = write_report(run, metrics=["rollout/my_*"])
    panels = [p["title"] for p in json.loads(result["json"].read_text())["panels"]]
    assert panels[-2:] == ["rollout/my_kl", "rollout/my_loss"], "matches sorted, strings skipped"
    assert "rollout/other" not in panels and "perf/tokens_per_sec" not in panels
    header = next(line for line in result["markdown"].read_text().splitlines() if line.startswith("| rollout_id"))
    assert header.endswith("| rollout/my_kl (constant) | rollout/my_loss (constant) |")
    # default: throughput (and eval/* keys outside eval sets); a key already in a panel is not repeated
    default = write_report(run, tmp_path / "default")
    panels = [p["title"] for p in json.loads(default["json"].read_text())["panels"]]
    assert panels[-1] == "perf/tokens_per_sec" and "rollout/my_kl" not in panels
    again = write_report(run, tmp_path / "again", metrics=["rollout/raw_*"])
    assert [p["title"] for p in json.loads(again["json"].read_text())["panels"]].count("Reward") == 1
    assert len(json.loads(again["json"].read_text())["panels"]) == len(panels) - 1
    with pytest.raises(UnknownMetricError, match=r"'rollout/nope\*' matches no numeric key .*rollout/my_kl"):
        write_report(run, tmp_path / "bad", metrics=["rollout/nope*"])
    proc = subprocess.run([sys.executable, "-m", "pipeline.report", str(run), "--metrics", "rollout/my_l*",
                           "--out", str(tmp_path / "cli")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "| rollout/my_loss (constant) |" in (tmp_path / "cli" / "report.md").read_text()
    proc = subprocess.run([sys.executable, "-m", "pipeline.report", str(run), "--metrics", "nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--metrics 'nope' matches no numeric key" in proc.stderr


def test_custom_metric_panels_are_capped_with_a_warning(tmp_path, caplog):
    run = tmp_path / "run"
    write_run(run, [0.5], extra={f"custom/m{i:02d}": float(i) for i in range(30)})
    panels = select_panels(find_runs(run)[1], ["custom/*"])
    assert [p.title for p, _ in panels if p.title.startswith("custom/")] == [f"custom/m{i:02d}" for i in range(24)]
    assert "30 keys match; plotting the first 24, leaving out custom/m24, custom/m25" in caplog.text


def test_zero_std_fraction_from_counts_and_group_size(tmp_path):
    run = tmp_path / "run"
    write_run(run, [0.5, 0.5, 0.5])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # 16 samples of n=4: 4 groups per batch
    rows[0].update({"rollout/num_samples": 16, "rollout/zero_std/count_0.0": 1.0, "rollout/zero_std/count_1.0": 1.0})
    rows[1].update({"rollout/num_samples": 16})
    rows[2].update({"rollout/num_samples": 16, "rollout/zero_std/count_0.0": 1.0,
                    "rollout/dynamic_filter/drop_zero_std_0.0": 2, "rollout/dynamic_filter/drop_too_long": 1})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("n_samples_per_prompt: 4\n")
    _, [data] = find_runs(run)
    assert data.series("report/zero_std_fraction") == [pytest.approx(2 / 4), 0.0, pytest.approx(1 / 4)]
    # (1 in the batch + 2 dropped) / (4 in the batch + 3 dropped); 0 drops elsewhere
    assert data.series("report/zero_std_fraction_generated") == [
        pytest.approx(2 / 4), 0.0, pytest.approx(3 / 7)]
    md = write_report(run)["markdown"].read_text()
    assert "| zero-std |" in md and table_rows(md, "0")[0][3] == "0.5"
    # group size unknown (no config) or 1: nothing is derived rather than a guess
    (run / ".hydra" / "config.yaml").write_text("n_samples_per_prompt: 1\n")
    assert "report/zero_std_fraction" not in find_runs(run)[1][0].keys()
    (run / ".hydra" / "config.yaml").unlink()
    assert "report/zero_std_fraction" not in find_runs(run)[1][0].keys()


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


def test_sweep_bands_are_mean_and_std_over_seeds(tmp_path):
    sweep = tmp_path / "sweep"
    written: dict[int, list[list[float]]] = {}
    for job, (seed, n) in enumerate([(s, n) for s in (1, 2, 3) for n in (2, 4)]):
        rewards = [0.1 * seed * (step + 1) + n / 10 for step in range(4)]
        write_run(sweep / str(job), rewards, [f"data_source.seed={seed}", f"n_samples_per_prompt={n}"])
        written.setdefault(n, []).append(rewards)
    data = json.loads(write_report(sweep)["json"].read_text())
    bands = {b["group"]: b for b in data["bands"] if b["key"] == "rollout/raw_reward"}
    assert set(bands) == {"n_samples_per_prompt=2 (3 jobs: 0, 2, 4)", "n_samples_per_prompt=4 (3 jobs: 1, 3, 5)"}
    for n, label in ((2, "n_samples_per_prompt=2 (3 jobs: 0, 2, 4)"), (4, "n_samples_per_prompt=4 (3 jobs: 1, 3, 5)")):
        per_step = list(zip(*written[n]))
        assert bands[label]["steps"] == [0, 1, 2, 3] and bands[label]["n"] == [3] * 4
        assert bands[label]["mean"] == pytest.approx([statistics.fmean(v) for v in per_step])
        assert bands[label]["std"] == pytest.approx([statistics.stdev(v) for v in per_step])
    # the plot draws the band's mean as the group curve, each seed as a thin line
    _, runs = find_runs(sweep)
    groups = [("n=2", [r for r in runs if r.overrides["n_samples_per_prompt"] == "2"])]
    panels = select_panels(runs)
    reward = [c for c in sweep_curves(groups, panels) if c.key == "rollout/raw_reward"]
    [mean] = [c for c in reward if not c.thin]
    assert mean.ys == pytest.approx([statistics.fmean(v) for v in zip(*written[2])]) and mean.band is not None
    assert sorted(c.members[0] for c in reward if c.thin) == ["0", "2", "4"]


def test_identical_curves_get_distinct_styles_and_offsets(tmp_path):
    sweep = tmp_path / "sweep"
    for job, n in enumerate((2, 4, 8)):
        write_run(sweep / str(job), [0.5, 0.5, 0.5], [f"n_samples_per_prompt={n}"])
    _, runs = find_runs(sweep)
    panels = select_panels(runs)
    reward = [c for c in sweep_curves([(r.name, [r]) for r in runs], panels) if c.key == "rollout/raw_reward"]
    assert len(reward) == 3 and all(c.ys == [0.5, 0.5, 0.5] for c in reward)
    assert len({(c.colour, c.marker) for c in reward}) == 3, "each job its own colour and marker"
    assert len({c.xs[0] for c in reward}) == 3 and all(abs(c.xs[0]) < 0.2 for c in reward), "slight offsets"
    # one run: eval pass@1 equals the mean reward for 0/1 rewards
    run = tmp_path / "run"
    write_run(run, [0.5, 0.5], extra={"eval/math-pass@2": 0.3, "eval/math-pass@1": 0.3})
    [data] = find_runs(run)[1]
    evals = [c for c in run_curves(data, select_panels([data])) if c.key.startswith("eval/math")]
    assert len(evals) == 2 and evals[0].ys == evals[1].ys
    assert evals[0].style != evals[1].style and evals[0].marker != evals[1].marker
    assert evals[0].xs != evals[1].xs


def test_all_zero_drops_and_buffer_are_tabulated_not_plotted(tmp_path):
    run = tmp_path / "run"
    write_run(run, [0.5, 0.25], extra={"rollout/groups_dropped": 0, "rollout/buffer_size": 0.0})
    result = write_report(run)
    data = json.loads(result["json"].read_text())
    assert "Dynamic-filter drops" not in data["plotted"] and "Buffer size" not in data["plotted"]
    assert "Reward" in data["plotted"]
    md = result["markdown"].read_text()
    assert "Not plotted (0 in every rollout; in the tables): Dynamic-filter drops, Buffer size." in md
    assert "| groups dropped (constant) | buffer (constant) |" in md
    write_run(tmp_path / "drops", [0.5, 0.25])
    assert "Dynamic-filter drops" in json.loads(write_report(tmp_path / "drops")["json"].read_text())["plotted"]


def test_bands_stay_in_the_quantitys_range():
    b = Band(steps=[0, 1], mean=[0.9, 0.1], std=[0.3, 0.3], n=[2, 2], lowest=0.0)
    assert band_limits(b, fraction=True) == (pytest.approx([0.6, 0.0]), pytest.approx([1.0, 0.4]))
    assert band_limits(b, fraction=False)[1] == pytest.approx([1.2, 0.4])
    negative = Band(steps=[0], mean=[0.1], std=[0.3], n=[2], lowest=-0.2)
    assert band_limits(negative, fraction=False)[0] == pytest.approx([-0.2])


def test_committed_real_sweep_report_is_what_the_report_writes(tmp_path):
    """docs/img/real_sweep holds the metrics of the real-model sweep in docs/getting-started.md; its report.md
    (and report.json) are what `python -m pipeline.report` writes from them today."""
    docs = ROOT / "docs" / "img" / "real_sweep"
    write_report(docs / "jobs", tmp_path, title="real model (SmolLM2-135M), 2 seeds × n_samples_per_prompt 2, 4")
    assert (tmp_path / "report.md").read_text() == (docs / "report.md").read_text(), (
        "regenerate: python -m pipeline.report docs/img/real_sweep/jobs --out docs/img/real_sweep --title '...'")
    assert json.loads((tmp_path / "report.json").read_text()) == json.loads((docs / "report.json").read_text())


def test_no_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(NoMetricsError, match="no metrics.jsonl"):
        write_report(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pipeline.report", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "no metrics.jsonl here or in its subfolders" in proc.stderr
    assert not (tmp_path / "report").exists()
    (tmp_path / "metrics.jsonl").write_text("")
    proc = subprocess.run([sys.executable, "-m", "pipeline.report", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "metrics.jsonl has no rollout yet" in proc.stderr, proc.stderr
    assert not (tmp_path / "report").exists()


def test_bad_metrics_line_names_file_and_line(tmp_path):
    write_run(tmp_path / "r", [0.5])
    with open(tmp_path / "r" / "metrics.jsonl", "a") as fh:
        fh.write("[1, 2]\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: expected a JSON object"):
        write_report(tmp_path / "r")


def _columns_match_metrics(run: Path, md: str, n_samples_per_prompt: int) -> list[dict]:
    """Each table row agrees with metrics.jsonl: reward, pass rate, truncated, zero-std, eval pass@1."""
    header = next(line for line in md.splitlines() if line.startswith("| rollout_id"))
    # a column whose series never changes is marked " (constant)" (pipeline/report/shape.py)
    cols = [c.strip().removesuffix(" (constant)") for c in header.strip("|").split("|")]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        [row] = table_rows(md, f"{m['step']} ")
        cell = dict(zip(cols, row))
        groups = m["rollout/num_samples"] / n_samples_per_prompt
        zero_std = sum(v for k, v in m.items() if k.startswith("rollout/zero_std/count_")) / groups
        assert cell["reward"] == f"{m['rollout/raw_reward']:.3g}" and cell["pass rate"] == f"{m['rollout/pass_rate']:.3g}"
        assert cell["truncated"] == f"{m['rollout/truncated_ratio']:.3g}" and cell["zero-std"] == f"{zero_std:.3g}"
        evals = [c for c in cols if c.startswith("eval ")]
        assert evals == ["eval math pass@1"] or evals == ["eval tiny pass@1"], cols
        assert cell[evals[0]] == (f"{m[f'eval/{evals[0].split()[1]}-pass@1']:.3g}" if m["step"] % 2 else "–")
    return metrics


@pytest.mark.timeout(180)
def test_cli_on_a_real_run(tmp_path):
    run = tmp_path / "smoke"
    subprocess.run([sys.executable, "run.py", "experiment=smoke", "num_rollout=4", "eval=engine", "eval_interval=2",
                    "n_samples_per_eval_prompt=2", f"hydra.run.dir={run}"], cwd=ROOT, check=True, capture_output=True,
                   timeout=150)
    proc = subprocess.run([sys.executable, "-m", "pipeline.report", str(run)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    _columns_match_metrics(run, (run / "report" / "report.md").read_text(), n_samples_per_prompt=2)
    panels = [p["title"] for p in json.loads((run / "report" / "report.json").read_text())["panels"]]
    assert {"Eval: math", "Truncated ratio", "Zero-std groups", "perf/tokens_per_sec"} <= set(panels)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_report_of_a_real_model_sweep(tmp_path):
    """The bundled model, a 2-job sweep over seeds with eval on 2 prompts; a short length limit
    so some samples are truncated: the report's bands and columns agree with metrics.jsonl."""
    eval_file = tmp_path / "tiny.jsonl"
    eval_file.write_text("".join((ROOT / "data" / "math_eval.jsonl").read_text().splitlines(keepends=True)[:2]))
    sweep = tmp_path / "sweep"
    subprocess.run([sys.executable, "run.py", "-m", "data_source.seed=1,2", "num_rollout=2", "rollout_batch_size=2",
                    "n_samples_per_prompt=2", "rollout_max_response_len=12", "eval=engine", "eval_interval=2",
                    "n_samples_per_eval_prompt=2", f"eval.datasets=[{{name: tiny, prompt_data: {eval_file}}}]",
                    "logger=jsonl", f"hydra.sweep.dir={sweep}"], cwd=ROOT, check=True, capture_output=True,
                   timeout=540)
    proc = subprocess.run([sys.executable, "-m", "pipeline.report", str(sweep)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    truncated = []
    for job in ("0", "1"):
        write_report(sweep / job)
        metrics = _columns_match_metrics(sweep / job, (sweep / job / "report" / "report.md").read_text(), 2)
        truncated += [m["rollout/truncated_ratio"] for m in metrics]
    assert max(truncated) > 0, "12 tokens truncate some answers of the real model"
    data = json.loads((sweep / "report" / "report.json").read_text())
    [band] = [b for b in data["bands"] if b["key"] == "rollout/raw_reward"]
    per_job = [[json.loads(line)["rollout/raw_reward"] for line in (sweep / j / "metrics.jsonl").read_text().splitlines()]
               for j in ("0", "1")]
    assert band["mean"] == pytest.approx([statistics.fmean(v) for v in zip(*per_job)])
    assert band["std"] == pytest.approx([statistics.stdev(v) for v in zip(*per_job)])


def _drawn_figure(monkeypatch) -> list:
    """Keep the figure plot_curves draws (it closes it after saving) to read its axes."""
    import pipeline.report.plots as plots

    kept: list = []
    monkeypatch.setattr(plots.plt, "close", kept.append)
    return kept


def test_train_and_eval_metrics_are_panels_by_default(tmp_path):
    run = tmp_path / "run"
    write_run(run, [0.25, 0.5, 0.75], extra={"train/lr": 1e-6, "rollout/my_thing": 2.0})
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):
        row.update({"train/loss": 0.5 - 0.1 * i, "train/grad_norm": 1.0 + i, "eval/judge": 3.0 + i})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    titles = [p["title"] for p in json.loads(write_report(run)["json"].read_text())["panels"]]
    assert {"train/grad_norm", "train/loss", "train/lr", "eval/judge"} <= set(titles), titles
    assert "rollout/my_thing" not in titles, "other keys still need --metrics"
    chosen = [p["title"] for p in json.loads(write_report(run, tmp_path / "c", metrics=["train/l*"])["json"]
                                             .read_text())["panels"]]
    assert "train/loss" in chosen and "train/grad_norm" not in chosen and "eval/judge" not in chosen


def test_identical_panels_are_drawn_once_with_both_names(tmp_path, monkeypatch):
    run = tmp_path / "run"
    # 0/1 rewards: the mean reward is the pass rate, step by step
    write_run(run, [0.25, 0.5, 0.75], pass_rate=False, extra={"train/lr": 2.0})
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row["rollout/pass_rate"] = row["rollout/raw_reward"]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept = _drawn_figure(monkeypatch)
    result = write_report(run)
    data = json.loads(result["json"].read_text())
    assert "Reward = Pass rate (train)" in data["plotted"]
    assert "Reward" not in data["plotted"] and "Pass rate (train)" not in data["plotted"]
    assert "Buffer size" in data["plotted"] and "train/lr" in data["plotted"], "constants (2.0 both) stay apart"
    assert [a.get_title() for a in kept[0].axes if a.get_visible()][0] == "Reward = Pass rate (train)"
    md = result["markdown"].read_text()
    assert "Drawn once (the same values in every rollout; both in the tables): Reward = Pass rate (train)." in md
    assert "| rollout_id | reward | pass rate |" in md, "the tables keep both columns"
    # same names, different values (pass rate = reward / 2 as write_run writes it): two panels
    write_run(tmp_path / "partial", [0.25, 0.5, 0.75])
    plotted = json.loads(write_report(tmp_path / "partial")["json"].read_text())["plotted"]
    assert "Reward" in plotted and "Pass rate (train)" in plotted


def test_constant_series_are_drawn_flat_and_tabled_as_constant(tmp_path, monkeypatch):
    run = tmp_path / "run"
    write_run(run, [0.25, 0.5, 0.75], extra={"train/lr": 1e-6, "train/zero": 0.0})
    kept = _drawn_figure(monkeypatch)
    result = write_report(run)
    axes = {a.get_title(): a for a in kept[0].axes if a.get_visible()}
    # buffer 2.0 and rollout time 0.5 throughout: value ± 10 %, not ± 0.02
    assert axes["Buffer size"].get_ylim() == pytest.approx((1.8, 2.2))
    assert axes["Rollout time"].get_ylim() == pytest.approx((0.45, 0.55))
    assert axes["train/lr"].get_ylim() == pytest.approx((0.9e-6, 1.1e-6))
    assert axes["train/zero"].get_ylim() == pytest.approx((-1.0, 1.0))
    lo, hi = axes["Reward"].get_ylim()
    assert lo < 0.25 and hi > 0.75 and hi - lo < 1, "a varying series is autoscaled as before"
    data = json.loads(result["json"].read_text())
    assert data["constant"] == {"Buffer size": 2.0, "Rollout time": 0.5, "train/lr": 1e-6, "train/zero": 0.0}
    header = next(line for line in result["markdown"].read_text().splitlines() if line.startswith("| rollout_id"))
    assert "| reward | pass rate |" in header and "| buffer (constant) | time (s) (constant) |" in header
    assert header.endswith("| train/lr (constant) | train/zero (constant) |")


def test_constant_means_the_same_value_up_to_rounding():
    from pipeline.report.load import RunData
    from pipeline.report.shape import constant_value, flat_ylim

    def run(values: list[float | None]) -> RunData:
        return RunData(Path("."), "r", rows=[{"step": i, "k": v} for i, v in enumerate(values)])

    assert constant_value([run([3.0, 3.0 + 1e-9, 3.0])], ["k"]) == pytest.approx(3.0)
    assert constant_value([run([3.0, 3.01])], ["k"]) is None
    assert constant_value([run([0.0, 1e-12])], ["k"]) is None, "around 0 only exact equality"
    assert constant_value([run([5.0])], ["k"]) is None, "one point is not a series"
    assert constant_value([run([1.0, None, 1.0]), run([1.0, 2.0])], ["k"]) is None, "every run of a sweep"
    assert flat_ylim(0.0, fraction=True) == (-0.1, 0.1) and flat_ylim(-4.0, fraction=False) == (-4.4, -3.6)
