"""bench/learn.py: its sweep dir (a `hydra.sweep.dir=` the user passes after `--` is where the jobs
write, so the bench reads its results from there; it used to add its own dir first, run.py took
the user's, and the bench then failed reading an empty dir after a 60-minute sweep), and
`spread_test`, which tells whether one sweep's eval curves lie within another's spread."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench_learn():
    spec = importlib.util.spec_from_file_location("bench_learn", ROOT / "bench" / "learn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_a_given_sweep_dir_wins_and_is_resolved_against_the_repository(tmp_path):
    learn = _bench_learn()
    assert learn.sweep_dir(["num_rollout=45", "hydra.sweep.dir=outputs/mine"]) == ROOT / "outputs" / "mine"
    assert learn.sweep_dir([f"hydra.sweep.dir={tmp_path}", f"hydra.sweep.dir={tmp_path / 'b'}"]) == tmp_path / "b"
    default = learn.sweep_dir(["num_rollout=45"])
    assert default.parent == ROOT / "outputs" / "bench_learn" and default.name[:2] == "20"


# the held-out pass@1 curves of docs/performance.md ("Learning over 2 workers", 2026-12-05): rollouts
# 0, 4, 9, 14, 19, 24, 29 of seeds 1-6, one worker and two
ONE_WORKER = [".38 .55 .68 .67 .75 .77 .77", ".38 .42 .60 .67 .73 .73 .80", ".38 .47 .65 .68 .75 .77 .77",
              ".38 .55 .70 .77 .72 .77 .73", ".38 .57 .70 .68 .67 .68 .73", ".38 .50 .65 .73 .77 .78 .85"]
TWO_WORKERS = [".38 .60 .63 .70 .75 .77 .73", ".38 .52 .62 .62 .68 .83 .88", ".35 .52 .58 .65 .68 .72 .77",
               ".38 .52 .63 .65 .65 .75 .78", ".35 .48 .63 .68 .75 .78 .73", ".35 .62 .70 .78 .75 .77 .77"]


def curves(rows: list[str], shift: float = 0.0) -> dict[str, dict[int, float]]:
    return {f"seed {i + 1}": {r: float(v) + (shift if r else 0.0) for r, v in zip((0, 4, 9, 14, 19, 24, 29),
                                                                              row.split(), strict=True)}
            for i, row in enumerate(rows)}


def test_two_workers_learning_curves_are_within_the_spread_of_one_workers():
    result = _bench_learn().spread_test(curves(TWO_WORKERS), curves(ONE_WORKER))
    assert result["rollouts"] == [4, 9, 14, 19, 24, 29] and result["runs"] == [6, 6] and result["values"] == 36
    assert result["mean gap"] == pytest.approx(-0.0030556, abs=1e-6)  # rollout 0 (before training) left out
    assert result["permutations"] == 924  # every way to pick 6 of the 12 runs
    assert result["p (|gap| at least this)"] == pytest.approx(786 / 924)
    assert (result["below the lowest"], result["above the highest"]) == (5, 5)
    assert result["below the lowest, shuffled runs (mean)"] == pytest.approx(4.1331, abs=1e-4)
    assert result["p (as many below)"] == pytest.approx(340 / 924)


def test_a_curve_that_learns_less_is_told_apart():
    result = _bench_learn().spread_test(curves(TWO_WORKERS, shift=-0.08), curves(ONE_WORKER))
    assert result["mean gap"] == pytest.approx(-0.0830556, abs=1e-6)
    assert result["p (|gap| at least this)"] == pytest.approx(2 / 924)  # only the split as measured, and its mirror
    assert result["below the lowest"] > 20 and result["p (as many below)"] < 0.01


def test_more_runs_than_the_permutation_cap_are_sampled_and_too_few_are_refused(monkeypatch):
    learn = _bench_learn()
    monkeypatch.setattr(learn, "PERMUTATIONS", 100)
    result = learn.spread_test(curves(TWO_WORKERS), curves(ONE_WORKER))
    assert result["permutations"] == 100 and 0.5 < result["p (|gap| at least this)"] <= 1.0
    with pytest.raises(ValueError, match=r"needs evals after rollout 0 common to every run and 2 or more runs .*"
                                         r"\(got 6 and 1 runs"):
        learn.spread_test(curves(TWO_WORKERS), curves(ONE_WORKER[:1]))
    with pytest.raises(ValueError, match=r"common rollouts \[\]"):
        learn.spread_test({"a": {0: 0.3}}, {"b": {0: 0.3}, "c": {0: 0.4}})


def fake_sweep(root: Path, rows: list[str]) -> Path:
    """A finished sweep dir as run.py -m writes it: per job metrics.jsonl (an eval row every 5th rollout) and run.log."""
    for job, curve in enumerate(curves(rows).values()):
        d = root / str(job)
        d.mkdir(parents=True)
        lines = [json.dumps({"step": step, "eval/math-pass@1": value, "perf/train_time": 2.0})
                 for step, value in curve.items()]
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        log = ["[2026-12-05 10:00:00,000][run][INFO] - start"]
        for minute, step in enumerate(curve, start=1):
            log += [f"[2026-12-05 10:{minute:02d}:00,000][eval][INFO] - ===== eval at rollout {step} =====",
                    f"[2026-12-05 10:{minute:02d}:30,000][eval][INFO] - eval/math-pass@1 {curve[step]}"]
        (d / "run.log").write_text("\n".join(log) + "\n")
    return root


def test_against_prints_the_spread_test_of_two_finished_sweeps(tmp_path, capsys):
    two, one = fake_sweep(tmp_path / "two", TWO_WORKERS), fake_sweep(tmp_path / "one", ONE_WORKER)
    code = _bench_learn().main(["--from", str(two), "--against", str(one), "--target", "0.8"])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(f"against {one}: "))
    result = json.loads(line.split(": ", 1)[1])
    assert result["below the lowest"] == 5 and result["permutations"] == 924 and result["runs"] == [6, 6]
    assert code == 1  # 5 of the 6 two-worker runs never reach 0.8
