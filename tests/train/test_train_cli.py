"""The trainer through the CLI (`python run.py trainer=...` in a subprocess): metrics per rollout,
trainer state with each checkpoint, resume, and the pre-flight errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from pipeline.sinks.jsonl import read_metrics

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("trainer_cli")
    rows = [{"input": f"What is {i} + {i + 2}?", "label": str(2 * i + 2)} for i in range(20)]
    (d / "arith.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d / "arith.jsonl"


def run_cli(args: list[str], timeout: int = 300, ok: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HYDRA_FULL_ERROR="1")
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if ok:
        assert proc.returncode == 0, f"run.py {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def test_function_trainer_metrics_state_and_resume(data, tmp_path):
    run = tmp_path / "run"
    common = ["engine=scripted", "logger=jsonl", f"data_source.path={data}", "rollout_batch_size=2",
              "n_samples_per_prompt=2", "rollout.progress=false", "rollout.summary=false", "trainer=function",
              "trainer.train_function_path=tests.plugins.trainer_hooks.count_train_data", "allowed_targets_extra=[tests.]",
              f"hydra.run.dir={run}"]
    run_cli(common + ["num_rollout=2"])
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["train/samples"] for r in rows] == [4.0, 4.0]
    assert [r["train/weight_version"] for r in rows] == [1.0, 2.0]
    assert all("perf/stage/train_time" in r for r in rows)
    assert sorted(p.name for p in (run / "trainer").iterdir()) == ["rollout_0", "rollout_1"]
    run_cli([f"resume={run}", "num_rollout=3"])
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["train/weight_version"] for r in rows] == [1.0, 2.0, 3.0]
    # the newest two trainer states are kept
    assert sorted(p.name for p in (run / "trainer").iterdir()) == ["rollout_1", "rollout_2"]


def test_a_damaged_newest_checkpoint_resumes_from_the_one_before_with_its_trainer_state(data, tmp_path):
    """resume= skips a checkpoint that fails its checksum; the trainer state of the checkpoint
    before it is still kept, so training continues from there."""
    run = tmp_path / "run"
    run_cli(["engine=scripted", "logger=jsonl", f"data_source.path={data}", "rollout_batch_size=2",
             "n_samples_per_prompt=2", "rollout.progress=false", "rollout.summary=false", "trainer=function",
             "trainer.train_function_path=tests.plugins.trainer_hooks.count_train_data",
             "allowed_targets_extra=[tests.]", "num_rollout=3", f"hydra.run.dir={run}"])
    newest = run / "checkpoints" / "rollout_2.json"
    newest.write_text(newest.read_text().replace('"epoch_id"', '"epoch_iD"', 1))
    proc = run_cli([f"resume={run}", "num_rollout=4"])
    assert "skipping invalid checkpoint" in proc.stdout + proc.stderr
    rows = read_metrics(run / "metrics.jsonl")
    # rollouts 2 and 3 trained on top of the state saved with checkpoint 1 (weight version 2)
    assert [r["train/weight_version"] for r in rows][-2:] == [3.0, 4.0]
    assert sorted(p.name for p in (run / "trainer").iterdir()) == ["rollout_2", "rollout_3"]


def test_trainer_none_is_the_default_and_writes_no_trainer_state(data, tmp_path):
    run = tmp_path / "run"
    run_cli(["engine=scripted", "logger=jsonl", f"data_source.path={data}", "rollout_batch_size=2",
             "n_samples_per_prompt=2", "num_rollout=1", f"hydra.run.dir={run}"])
    assert not (run / "trainer").exists()
    assert not any(k.startswith("train/") for k in read_metrics(run / "metrics.jsonl")[0])


def test_bad_trainer_keys_fail_at_pre_flight(data, tmp_path):
    proc = run_cli(["engine=scripted", "logger=jsonl", f"data_source.path={data}", "trainer=policy_gradient",
                    "trainer.kl_loss_type=k7", "trainer.micro_batch_size=0", f"hydra.run.dir={tmp_path}/run"],
                   ok=False)
    assert proc.returncode != 0
    assert "trainer.kl_loss_type='k7'" in proc.stderr and "trainer.micro_batch_size=0" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_policy_gradient_on_the_real_model_resumes_bit_identically(data, tmp_path):
    """Deterministic mode, SmolLM2 in process: a run of 2 rollouts, and a run of 1 resumed to 2,
    end with the same trainer state bit for bit and the same losses."""
    common = ["logger=jsonl", f"data_source.path={data}", "rollout_batch_size=2", "n_samples_per_prompt=2",
              "rollout_max_response_len=6", "rollout.deterministic=true", "rollout.progress=false",
              "rollout.summary=false", "trainer=policy_gradient", "trainer.lr=1e-4", "engine.max_batch_size=4"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    # save_interval=2: the straight run keeps only the state compared below (disk: 1.6 GB each)
    run_cli(common + ["num_rollout=2", "save_interval=2", f"hydra.run.dir={straight}"], timeout=600)
    run_cli(common + ["num_rollout=1", f"hydra.run.dir={split}"], timeout=600)
    run_cli([f"resume={split}", "num_rollout=2"], timeout=600)
    a, b = read_metrics(straight / "metrics.jsonl"), read_metrics(split / "metrics.jsonl")
    assert [r["train/loss"] for r in a] == [r["train/loss"] for r in b]
    assert [r["train/weight_version"] for r in b] == [1.0, 2.0]
    pa = load_file(str(straight / "trainer" / "rollout_1" / "policy.safetensors"))
    pb = load_file(str(split / "trainer" / "rollout_1" / "policy.safetensors"))
    assert pa.keys() == pb.keys() and all((pa[k] == pb[k]).all() for k in pa)
    assert (straight / "policy" / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_learn_sweep_gives_curves_per_job_in_wandb_and_bands_per_n(data, tmp_path):
    """`-m experiment=learn data_source.seed=... n_samples_per_prompt=...` (the tour's sweep,
    shrunk): every job trains, logs its eval curve to offline wandb in one group, and the
    report averages the seeds into one mean ± std band per n_samples_per_prompt."""
    from pipeline.report.build import write_report
    from tests.sinks import wandb_records

    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"input": f"What is {i} + 1?", "label": str(i + 1)}) + "\n"
                                 for i in range(3)))
    sweep = tmp_path / "sweep"
    # LoRA: what is tested here is the sweep's logging and report, and four fully fine-tuned runs
    # would leave 8 GB of trainer states and policies behind; no dynamic sampling: with 3-token
    # answers most groups score all the same, and refilling the batch took ~18 s a job
    run_cli(["-m", "experiment=learn", "data_source.seed=1,2", "n_samples_per_prompt=2,3", f"data_source.prompt_data={data}",
             "trainer.lora_rank=4", "dynamic_filter=none", "rollout.over_sampling=fixed", "num_rollout=2", "rollout_batch_size=1", "rollout_max_response_len=3", "eval_interval=2",
             f"eval.datasets.0.prompt_data={eval_file}", "rollout.progress=false", "rollout.summary=false",
             f"hydra.sweep.dir={sweep}"], timeout=880)
    jobs = sorted((p for p in sweep.iterdir() if (p / "metrics.jsonl").is_file()), key=lambda p: int(p.name))
    assert len(jobs) == 4
    for job in jobs:
        wandb_file = next((job / "wandb").glob("offline-run-*/run-*.wandb"))
        info = wandb_records.run_info(wandb_file)
        assert info["group"] == sweep.name
        logged = wandb_records.history(wandb_file)
        evals = [row["eval/math-pass@1"] for row in logged if "eval/math-pass@1" in row]
        assert len(evals) == 2  # before the first update and after the second
        assert all(0.0 <= v <= 1.0 for v in evals)
        assert [row["train/weight_version"] for row in logged if "train/weight_version" in row] == [1, 2]
    report = json.loads(Path(write_report(sweep)["json"]).read_text())
    bands = [b for b in report["bands"] if b["key"] == "eval/math-pass@1"]
    assert sorted(b["group"].split(" (")[0] for b in bands) == ["n_samples_per_prompt=2", "n_samples_per_prompt=3"]
    assert all(len(b["jobs"]) == 2 for b in bands)
