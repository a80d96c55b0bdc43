"""Every writer of run-dir files follows the umask (`pipeline.process.atomic.follow_umask`): the policy
export, the LoRA adapter, the trainer state, the weight-sync folders and the train data, which
safetensors and mkdtemp would otherwise leave 0600 / 0700 (an inference server running as
another user could not read the policy)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pipeline.process import atomic
from pipeline.engines.weight_sync import save_hf_folder
from pipeline.sinks.files import write_train_data
from pipeline.train.model import export_hf
from pipeline.train.state import save_state

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=[0o022, 0o027], ids=["umask022", "umask027"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """Relative path -> permission bits of `root` and everything under it."""
    return {str(p.relative_to(root.parent)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def expected(root: Path, mask: int) -> dict[str, int]:
    return {name: (0o777 if (root.parent / name).is_dir() else 0o666) & ~mask for name in modes(root)}


def test_atomic_dir_gives_what_any_writer_made_the_umask_modes(tmp_path, umask):
    with atomic.atomic_dir(tmp_path / "out") as tmp:
        save_file({"a": torch.zeros(2)}, str(tmp / "w.safetensors"))  # safetensors writes 0600
        sub = Path(atomic.tempfile.mkdtemp(dir=tmp))  # 0700
        (sub / "f.txt").write_text("x")
        os.chmod(sub / "f.txt", 0o600)
        script = tmp / "run.sh"
        script.write_text("#!/bin/sh\n")
        os.chmod(script, 0o700)
    got = modes(tmp_path / "out")
    assert got.pop("out/run.sh") == 0o777 & ~umask  # an execute bit is kept
    assert got == {k: v for k, v in expected(tmp_path / "out", umask).items() if k != "out/run.sh"}
    assert len(got) == 4


def test_follow_umask_of_a_file_and_a_link(tmp_path, umask):
    target = tmp_path / "t.bin"
    target.write_bytes(b"x")
    os.chmod(target, 0o600)
    (tmp_path / "link").symlink_to(target)
    atomic.follow_umask(tmp_path / "link")  # a link is left alone, not followed
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    atomic.follow_umask(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_every_writer_of_weights_follows_the_umask(tmp_path, umask):
    from trainer_fixtures import tiny_llama

    model = tiny_llama(torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    save_state(tmp_path / "trainer" / "rollout_0", model, optimizer, {"weight_version": 1, "optimizer_step": 0})
    export_hf(model, None, str(tmp_path / "policy"))
    save_hf_folder(model.state_dict(), None, tmp_path / "weights", 3)
    write_train_data(tmp_path / "train_data" / "rollout_0", {"tokens": [[1, 2], [3]], "rewards": [1.0, 0.0]})
    for root in ("trainer/rollout_0", "policy", "weights/v3", "train_data"):
        got = modes(tmp_path / root)
        assert got == expected(tmp_path / root, umask), root
    names = {p.name for p in tmp_path.rglob("*.safetensors")}
    assert names == {"policy.safetensors", "optimizer.safetensors", "model.safetensors", "rollout_0.safetensors"}


def test_the_lora_adapter_folder_follows_the_umask(tmp_path, umask):
    from peft import LoraConfig, get_peft_model
    from trainer_fixtures import tiny_llama

    from pipeline.train.model import save_adapter

    model = get_peft_model(tiny_llama(torch.float32), LoraConfig(r=2, target_modules=["q_proj"]))
    save_adapter(model, str(tmp_path / "adapter"))
    got = modes(tmp_path / "adapter")
    assert "adapter/adapter_model.safetensors" in got
    assert got == expected(tmp_path / "adapter", umask)
