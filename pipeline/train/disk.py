"""Disk use of the trainer's run-dir folders: the estimate logged at start, and the pruning of
the trainer states `<run>/trainer/rollout_<id>/`.

Estimate (`estimate_disk`, logged by `log_disk_estimate` when `trainer=policy_gradient` is built,
before the first rollout): a trainer state holds the trainable parameters and AdamW's two moments
(`exp_avg`, `exp_avg_sq`), all float32: 12 bytes per trainable parameter (the whole model for full
fine-tuning, the adapters for LoRA; with num_workers > 1 the shards add up to the same), plus a
small step tensor per parameter tensor and the RNG states. The final policy export `<run>/policy/`
is the whole model (LoRA merged) in float32: 4 bytes per parameter, tied weights once. The
parameter counts come from the checkpoint's HF config with the model (and its LoRA wrapping) built
on the meta device: no weights are read.

Pruning (`prune_states`): after each save the newest `trainer.keep_states` states stay, and never
the state of the newest data-source checkpoint (`<run>/checkpoints/rollout_<id>.json`): the state
is written just before its data-source checkpoint, so until that is written a resume continues
from the previous checkpoint and needs its state. At most `keep_states + 1` states are on disk at
once (the newest being written beside the kept ones).
"""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.data.checkpoint import list_checkpoints
from pipeline.engines.assets import resolve_checkpoint
from pipeline.process.atomic import numbered_dirs, prune_numbered_dirs
from pipeline.train.model import TOKENIZER_FILES, wrap_lora

__all__ = ["DiskEstimate", "count_parameters", "estimate_disk", "human_bytes", "log_disk_estimate",
           "prune_states"]

logger = logging.getLogger(__name__)

# float32 parameter + AdamW exp_avg + exp_avg_sq
_STATE_BYTES_PER_PARAM = 12
# per parameter tensor: AdamW's float32 `step` and its safetensors header entries (measured: 700-830
# bytes, the long names of peft's LoRA tensors the most)
_STATE_BYTES_PER_TENSOR = 800
# the RNG states, trainer_state.json, safetensors headers; the export's config.json and header
_STATE_OVERHEAD = 16 * 1024
_EXPORT_OVERHEAD = 16 * 1024
_NAME = re.compile(r"rollout_(-?\d+)")


@dataclass(frozen=True)
class DiskEstimate:
    """Bytes the trainer's folders of one run take (module docstring)."""

    trainable_params: int
    total_params: int
    state_bytes: int
    export_bytes: int
    keep_states: int
    free_bytes: int

    @property
    def most_bytes(self) -> int:
        """The most the trainer states (keep_states + 1 while one is written) and the export take."""
        return (self.keep_states + 1) * self.state_bytes + self.export_bytes


def human_bytes(n: float) -> str:
    """`n` bytes as B / KB / MB / GB / TB (powers of 1000, as `du --si` and disk vendors count)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.3g} TB"


def count_parameters(folder: str, lora_rank: int, lora_alpha: float, lora_dropout: float,
                     lora_target_modules: Any) -> tuple[int, int, int]:
    """(trainable parameters, trainable tensors, parameters of the plain model) of the HF checkpoint
    `folder` with the trainer's LoRA keys, built on the meta device (no weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
        total = sum(p.numel() for p in model.parameters())
        wrapped = wrap_lora(model, lora_rank, lora_alpha, lora_dropout, lora_target_modules)
    trainable = [p for p in wrapped.parameters() if p.requires_grad]
    return sum(p.numel() for p in trainable), len(trainable), total


def _free_bytes(run_dir: str) -> int:
    """Free space on the filesystem of `run_dir` (its nearest existing folder)."""
    path = Path(run_dir).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def estimate_disk(keys: dict[str, Any], run_dir: str) -> DiskEstimate | None:
    """The estimate for trainer `keys` (conf/trainer/policy_gradient.yaml) writing into `run_dir`;
    None without an hf_checkpoint (a model handed in by code)."""
    if keys["hf_checkpoint"] is None:
        return None
    folder = resolve_checkpoint(keys["hf_checkpoint"], keys["cache_dir"])
    trainable, tensors, total = count_parameters(folder, int(keys["lora_rank"]), keys["lora_alpha"],
                                                 keys["lora_dropout"], keys["lora_target_modules"])
    state = _STATE_BYTES_PER_PARAM * trainable + _STATE_BYTES_PER_TENSOR * tensors + _STATE_OVERHEAD
    # the export copies the checkpoint's tokenizer files beside model.safetensors
    copied = sum((Path(folder) / name).stat().st_size for name in TOKENIZER_FILES if (Path(folder) / name).is_file())
    return DiskEstimate(trainable_params=trainable, total_params=total, state_bytes=state,
                        export_bytes=4 * total + copied + _EXPORT_OVERHEAD, keep_states=int(keys["keep_states"]),
                        free_bytes=_free_bytes(run_dir))


def log_disk_estimate(keys: dict[str, Any], run_dir: str) -> DiskEstimate | None:
    """Log the estimate at INFO (one line), and a warning when it exceeds the free space."""
    est = estimate_disk(keys, run_dir)
    if est is None:
        return None
    what = "LoRA adapters" if int(keys["lora_rank"]) > 0 else "parameters"
    logger.info("disk: each trainer state takes ~%s (%s trainable %s + AdamW moments, float32), the final "
                "policy export ~%s; trainer.keep_states=%d, so the run dir holds up to %s for them (%d states "
                "while the newest is written, + the export); %s free on %s", human_bytes(est.state_bytes),
                f"{est.trainable_params / 1e6:.1f}M", what, human_bytes(est.export_bytes), est.keep_states,
                human_bytes(est.most_bytes), est.keep_states + 1, human_bytes(est.free_bytes), run_dir)
    if est.most_bytes > est.free_bytes:
        logger.warning("disk: the trainer states and the policy export may need %s but %s has %s free; lower "
                       "trainer.keep_states, raise save_interval or free space (docs/training.md, \"Disk use\")",
                       human_bytes(est.most_bytes), run_dir, human_bytes(est.free_bytes))
    return est


def prune_states(run_dir: str, keep: int, writing: int | None = None) -> list[Path]:
    """Delete trainer states `<run>/trainer/rollout_<id>` beyond the newest `keep`, never the one of
    the newest data-source checkpoint in `<run>/checkpoints` (when there is none there, e.g. a
    data source with its own save_dir: the newest state older than `writing`, the one being
    saved); returns what was removed."""
    root = Path(run_dir) / "trainer"
    checkpoints = list_checkpoints(Path(run_dir) / "checkpoints")
    if checkpoints:
        protected: int | None = checkpoints[-1][0]
    else:
        older = [i for i, _ in numbered_dirs(root, _NAME) if writing is None or i < writing]
        protected = older[-1] if older else None
    return prune_numbered_dirs(root, _NAME, keep, protect=protected)
