"""The README's "Training at scale" commands: each one's overrides pass pre-flight on this CPU
machine, or are refused only for what this machine lacks (a GPU, a Ray cluster), in words that
say so."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.cluster import devices
from pipeline.config import ConfigError, validate

ROOT = Path(__file__).resolve().parents[1]
TITLE = "### Training at scale: N workers on torch.distributed, GPUs, several nodes"


def commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(TITLE, 1)[1].split("\n### ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0]
    return [re.split(r"\s+#\s", line)[0].strip() for line in block.splitlines() if line.startswith("python run.py")]


def test_the_section_has_its_commands():
    found = commands()
    assert len(found) >= 6 and any("trainer.num_workers=2" in c for c in found)


@pytest.mark.parametrize("command", commands())
def test_each_command_passes_pre_flight_or_names_what_this_machine_lacks(command, tmp_path, monkeypatch):
    if "<run dir>" in command:
        pytest.skip("needs a run dir (a resume): tests/resume/test_resume_kill_worker.py runs it")
    monkeypatch.setattr(devices, "visible_gpus", lambda: 0)
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 0)
    overrides = shlex.split(command)[2:] + [f"paths.output_dir={tmp_path}/out", f"paths.cache_dir={tmp_path}/c"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    # with a cluster address the nodes' GPUs count, not this machine's (the workers check them)
    needs_gpu = "device=cuda" in command and "address=" not in command
    if not needs_gpu:
        validate(cfg)
        return
    with pytest.raises(ConfigError, match="cuda, but this machine has no CUDA device"):
        validate(cfg)
