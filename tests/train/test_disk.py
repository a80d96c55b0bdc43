"""The trainer's disk use: the estimate logged at start (checked against what the trainer really
writes) and trainer.keep_states, which never prunes the state a resume needs."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.stages.train import restore_trainer, save_trainer
from pipeline.train import disk
from pipeline.train.disk import estimate_disk, log_disk_estimate, prune_states
from pipeline.train.model import export_hf, wrap_lora
from pipeline.train.preflight import trainer_problems
from pipeline.train.state import save_state


def _tiny_checkpoint(folder: Path) -> Path:
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=2000, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    config.save_pretrained(folder)
    (folder / "tokenizer.json").write_text("x" * 50_000)
    return folder


def _keys(folder: Path, lora_rank: int = 0, keep_states: int = 2) -> dict:
    return {"hf_checkpoint": str(folder), "cache_dir": None, "lora_rank": lora_rank, "lora_alpha": 16,
            "lora_dropout": 0.0, "lora_target_modules": "all-linear", "keep_states": keep_states}


def _du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_estimate_matches_what_the_trainer_writes(tmp_path, lora_rank):
    from transformers import AutoConfig, AutoModelForCausalLM

    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    est = estimate_disk(_keys(ckpt, lora_rank), str(tmp_path / "run" / "not yet"))
    torch.manual_seed(0)
    model = wrap_lora(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ckpt)), lora_rank, 16, 0.0,
                      "all-linear")
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert est.trainable_params == sum(p.numel() for p in trainable)
    assert est.total_params == sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    assert (est.trainable_params < est.total_params / 5) == bool(lora_rank)
    opt = torch.optim.AdamW(trainable, lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    save_state(tmp_path / "state", model, opt, {"weight_version": 1, "optimizer_step": 1})
    assert _du(tmp_path / "state") == pytest.approx(est.state_bytes, rel=0.05)
    export_hf(model, str(ckpt), str(tmp_path / "policy"))
    assert _du(tmp_path / "policy") == pytest.approx(est.export_bytes, rel=0.05)
    assert est.most_bytes == 3 * est.state_bytes + est.export_bytes
    assert est.free_bytes == shutil.disk_usage(tmp_path).free or est.free_bytes > 0


def test_estimate_is_logged_and_warns_when_the_disk_is_too_small(tmp_path, caplog, monkeypatch):
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    with caplog.at_level(logging.INFO, logger="pipeline.train.disk"):
        est = log_disk_estimate(_keys(ckpt, keep_states=3), str(tmp_path))
    [line] = [r.getMessage() for r in caplog.records]
    assert f"each trainer state takes ~{disk.human_bytes(est.state_bytes)}" in line
    assert "trainer.keep_states=3" in line and "4 states while the newest is written" in line
    assert f"{disk.human_bytes(est.free_bytes)} free on {tmp_path}" in line
    caplog.clear()
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 90, 10))
    with caplog.at_level(logging.INFO, logger="pipeline.train.disk"):
        log_disk_estimate(_keys(ckpt), str(tmp_path))
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "has 10 B free; lower trainer.keep_states" in warning.getMessage()
    assert estimate_disk({**_keys(ckpt), "hf_checkpoint": None}, str(tmp_path)) is None


class _Trainer:
    """Writes a folder per save, like the real trainers; loads back its weight version."""

    def __init__(self, keep_states: int) -> None:
        self.keep_states = keep_states
        self.weight_version = 0

    def save(self, directory: str) -> None:
        Path(directory).mkdir(parents=True)
        (Path(directory) / "v.json").write_text(json.dumps(self.weight_version))

    def load(self, directory: str) -> None:
        self.weight_version = json.loads((Path(directory) / "v.json").read_text())


def _checkpoint(run: Path, rollout_id: int) -> None:
    (run / "checkpoints").mkdir(exist_ok=True)
    (run / "checkpoints" / f"rollout_{rollout_id}.json").write_text("{}")


def _states(run: Path) -> list[str]:
    return sorted((p.name for p in (run / "trainer").iterdir()), key=lambda n: int(n.split("_")[1]))


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_keep_states_keeps_the_newest_and_the_one_a_resume_needs(tmp_path, keep):
    run = tmp_path / "run"
    run.mkdir()
    trainer = _Trainer(keep)
    for rollout_id in range(5):
        trainer.weight_version = rollout_id + 1
        save_trainer(trainer, str(run), rollout_id)  # the runner's order: the state, then its checkpoint
        assert f"rollout_{rollout_id - 1}" in _states(run) or rollout_id == 0, "the newest checkpoint's state"
        assert len(_states(run)) <= max(keep, 2)
        _checkpoint(run, rollout_id)
    # keep 1: the previous state stays until the next save (its checkpoint may be the one resumed)
    assert _states(run) == [f"rollout_{i}" for i in range(5 - max(keep, 2), 5)]
    # killed between the state of rollout 5 and its checkpoint: the resume continues from 4
    trainer.weight_version = 6
    save_trainer(trainer, str(run), 5)
    fresh = _Trainer(keep)
    restore_trainer(fresh, None, str(run), 4)
    assert fresh.weight_version == 5


def test_prune_states_without_checkpoints_in_the_run_dir_keeps_the_previous(tmp_path):
    # a data source with its own save_dir: the state before the one being written stays
    for i in range(3):
        (tmp_path / "trainer" / f"rollout_{i}").mkdir(parents=True)
    assert prune_states(str(tmp_path), 1, writing=2) == [tmp_path / "trainer" / "rollout_0"]
    assert _states(tmp_path) == ["rollout_1", "rollout_2"]


def test_keep_states_preflight():
    base = {"_target_": "pipeline.train.build.policy_gradient_trainer"}
    for bad in (0, -1, 1.5, "2", None):
        problems = trainer_problems({"trainer": {**base, "keep_states": bad}})
        assert f"trainer.keep_states={bad!r}: expected an integer >= 1" in problems
    assert not [p for p in trainer_problems({"trainer": {**base, "keep_states": 1}}) if "keep_states" in p]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_real_model_run_logs_the_estimate_keeps_states_resumes_and_reports_train_panels(tmp_path):
    """SmolLM2-135M with LoRA (small states): the estimate line before rollout 0 agrees with the
    folders written; keep_states=1 leaves the newest state and the one of the checkpoint before;
    a resume (changing keep_states, a resume-safe key) continues; the report draws train/* panels."""
    import os
    import subprocess
    import sys

    from pipeline.report import write_report

    root = Path(__file__).resolve().parents[2]
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps({"input": f"What is {i} + {i + 2}?", "label": str(2 * i + 2)}) + "\n"
                            for i in range(8)))
    run = tmp_path / "run"
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    common = ["logger=jsonl", "rollout.progress=false", "rollout.summary=false"]
    subprocess.run([sys.executable, "run.py", *common, f"data_source.path={data}", "rollout_batch_size=2",
                    "n_samples_per_prompt=2", "rollout_max_response_len=6", "trainer=policy_gradient",
                    "trainer.lora_rank=4", "trainer.keep_states=1", "engine.max_batch_size=4", "num_rollout=3",
                    f"hydra.run.dir={run}"], cwd=root, env=env, check=True, capture_output=True, timeout=240)
    log = (run / "run.log").read_text()
    [line] = [x for x in log.splitlines() if "pipeline.train.disk" in x]
    assert log.index("pipeline.train.disk") < log.index("rollouts 0..2"), "logged before the first rollout"
    assert "trainer.keep_states=1" in line and "2 states while the newest is written" in line
    assert sorted(p.name for p in (run / "trainer").iterdir()) == ["rollout_1", "rollout_2"]
    state_mb = float(line.split("each trainer state takes ~")[1].split(" MB")[0])
    export_mb = float(line.split("the final policy export ~")[1].split(" MB")[0])
    assert _du(run / "trainer" / "rollout_2") / 1e6 == pytest.approx(state_mb, rel=0.05)
    assert _du(run / "policy") / 1e6 == pytest.approx(export_mb, rel=0.05)
    subprocess.run([sys.executable, "run.py", f"resume={run}", "num_rollout=4", "trainer.keep_states=2"], cwd=root,
                   env=env, check=True, capture_output=True, timeout=240)
    assert sorted(p.name for p in (run / "trainer").iterdir()) == ["rollout_2", "rollout_3"]
    plotted = json.loads(write_report(run)["json"].read_text())["plotted"]
    assert {"train/loss", "train/grad_norm", "train/lr", "train/weight_version"} <= set(plotted), plotted


def test_human_bytes_counts_in_powers_of_1000():
    h = disk.human_bytes
    assert [h(0), h(999), h(1000), h(1500), h(999_499), h(1_000_000)] == ["0 B", "999 B", "1 KB", "1.5 KB",
                                                                         "999 KB", "1 MB"]
    assert [h(1.61e9), h(2e12), h(3.5e15)] == ["1.61 GB", "2 TB", "3.5e+03 TB"]
    assert h(12.7) == "12 B", "bytes are whole"


def _fixed(monkeypatch, lora_rank: int, free: int) -> disk.DiskEstimate:
    est = disk.DiskEstimate(trainable_params=134_515_008, total_params=134_515_008, state_bytes=1_614_000_000,
                            export_bytes=546_000_000, keep_states=2, free_bytes=free)
    monkeypatch.setattr(disk, "estimate_disk", lambda keys, run_dir: est)
    return est


def test_the_logged_line_and_the_warning_word_for_word(monkeypatch, caplog):
    keys = {"lora_rank": 0}
    _fixed(monkeypatch, 0, free=76_600_000_000)
    with caplog.at_level(logging.INFO, logger="pipeline.train.disk"):
        disk.log_disk_estimate(keys, "/runs/r")
    [line] = [r.getMessage() for r in caplog.records]
    assert line == ("disk: each trainer state takes ~1.61 GB (134.5M trainable parameters + AdamW moments, float32), "
                    "the final policy export ~546 MB; trainer.keep_states=2, so the run dir holds up to 5.39 GB for "
                    "them (3 states while the newest is written, + the export); 76.6 GB free on /runs/r")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipeline.train.disk"):
        disk.log_disk_estimate({"lora_rank": 4}, "/runs/r")
    assert "(134.5M trainable LoRA adapters + AdamW moments" in caplog.records[0].getMessage()
    caplog.clear()
    monkeypatch.setattr(disk, "estimate_disk", lambda keys, run_dir: disk.DiskEstimate(1_050_000, 134_515_008, 1, 1, 1, 9))
    with caplog.at_level(logging.INFO, logger="pipeline.train.disk"):
        disk.log_disk_estimate({"lora_rank": 4}, "/runs/r")
    assert "(1.1M trainable LoRA adapters" in caplog.records[0].getMessage(), "millions of parameters"
    caplog.clear()
    est = _fixed(monkeypatch, 0, free=5_388_000_000)  # exactly what it needs: no warning
    assert est.most_bytes == est.free_bytes
    with caplog.at_level(logging.INFO, logger="pipeline.train.disk"):
        disk.log_disk_estimate({"lora_rank": 1}, "/runs/r")
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "trainable LoRA adapters" in caplog.records[0].getMessage(), "rank 1 is LoRA"
    caplog.clear()
    _fixed(monkeypatch, 0, free=5_387_999_999)
    with caplog.at_level(logging.INFO, logger="pipeline.train.disk"):
        disk.log_disk_estimate(keys, "/runs/r")
    assert caplog.records[1].getMessage() == (
        "disk: the trainer states and the policy export may need 5.39 GB but /runs/r has 5.39 GB free; lower "
        "trainer.keep_states, raise save_interval or free space (docs/training.md, \"Disk use\")")


def test_the_estimate_reads_the_checkpoint_through_the_cache_and_the_free_space_of_the_nearest_folder(
        tmp_path, monkeypatch):
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    asked: list = []
    real_resolve = disk.resolve_checkpoint
    monkeypatch.setattr(disk, "resolve_checkpoint", lambda name, cache: asked.append((name, cache)) or
                        real_resolve(name, cache))
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda p: asked.append(p) or shutil._ntuple_diskusage(9, 1, 8))
    (tmp_path / "outputs").mkdir()
    est = estimate_disk({**_keys(ckpt), "cache_dir": str(tmp_path / "cache")}, str(tmp_path / "outputs" / "a" / "b"))
    assert asked == [(str(ckpt), str(tmp_path / "cache")), (tmp_path / "outputs").resolve()]
    assert est.free_bytes == 8
    # the export: 4 bytes per parameter, the copied tokenizer files and a fixed overhead on top
    assert est.export_bytes == 4 * est.total_params + disk._EXPORT_OVERHEAD + sum(
        (ckpt / n).stat().st_size for n in disk.TOKENIZER_FILES if (ckpt / n).is_file())


def test_prune_protects_the_newest_checkpoints_state_even_when_older_than_the_kept_ones(tmp_path, monkeypatch):
    for i in range(6):
        (tmp_path / "trainer" / f"rollout_{i}").mkdir(parents=True)
    _checkpoint(tmp_path, 2)  # resumes continue from 2 (3..5 were written after it, by a run killed since)
    assert prune_states(str(tmp_path), 1, writing=5) == [tmp_path / "trainer" / f"rollout_{i}" for i in (0, 1, 3, 4)]
    assert _states(tmp_path) == ["rollout_2", "rollout_5"]
    # no checkpoints: the newest state older than the one being written stays, whatever their number
    for i in (0, 1, 3, 4):
        (tmp_path / "trainer" / f"rollout_{i}").mkdir()
    shutil.rmtree(tmp_path / "checkpoints")
    prune_states(str(tmp_path), 1, writing=5)
    assert _states(tmp_path) == ["rollout_4", "rollout_5"]


def test_prune_leaves_what_is_not_a_state_folder(tmp_path):
    for i in range(3):
        (tmp_path / "trainer" / f"rollout_{i}").mkdir(parents=True)
    (tmp_path / "trainer" / "notes").mkdir()
    (tmp_path / "trainer" / "rollout_9").write_text("a file, not a state")
    assert prune_states(str(tmp_path), 1, writing=2) == [tmp_path / "trainer" / "rollout_0"]
    assert sorted(p.name for p in (tmp_path / "trainer").iterdir()) == ["notes", "rollout_1", "rollout_2", "rollout_9"]


def test_a_state_that_cannot_be_removed_does_not_stop_the_run(tmp_path, monkeypatch):
    for i in range(3):
        (tmp_path / "trainer" / f"rollout_{i}").mkdir(parents=True)

    def rmtree(path, ignore_errors=False):
        if not ignore_errors:
            raise PermissionError(f"read-only: {path}")

    monkeypatch.setattr(disk.shutil, "rmtree", rmtree)
    assert prune_states(str(tmp_path), 1, writing=2) == [tmp_path / "trainer" / "rollout_0"]
