"""The trainer's policy: the HF causal LM of `hf_checkpoint`, fully trainable or with LoRA (peft).

`load_policy` reads the same local folder the engines load (`pipeline.engines.assets`), in
float32 (the master weights; bf16 is autocast at run time). With `lora_rank > 0` only the
adapters train; the frozen base doubles as the reference model (adapters disabled), and
`merged_state_dict` gives the engines plain HF names with the adapters folded in
(W + B A * alpha / r), so an engine never needs peft.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from pipeline.process.atomic import atomic_dir
from pipeline.engines.assets import resolve_checkpoint

__all__ = ["load_policy", "merged_state_dict", "reference_context", "frozen_copy", "is_lora", "save_adapter",
           "export_hf", "export_state", "wrap_lora", "TOKENIZER_FILES"]

logger = logging.getLogger(__name__)


def load_policy(hf_checkpoint: str, cache_dir: str | None, lora_rank: int, lora_alpha: float,
                lora_dropout: float, lora_target_modules: Any, attn_implementation: str | None = None) -> Any:
    """The policy model in float32, eval mode (no dropout), LoRA-wrapped when lora_rank > 0;
    `attn_implementation` None: transformers' default."""
    from transformers import AutoModelForCausalLM

    path = resolve_checkpoint(hf_checkpoint, cache_dir)
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **extra)
    logger.info("trainer policy loaded from %s", path)
    return wrap_lora(model, lora_rank, lora_alpha, lora_dropout, lora_target_modules)


def wrap_lora(model: Any, lora_rank: int, lora_alpha: float, lora_dropout: float, target_modules: Any) -> Any:
    """`model` itself (lora_rank 0) or a peft LoRA model around it; eval mode either way."""
    if lora_rank <= 0:
        return model.eval()
    from peft import LoraConfig, get_peft_model

    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    config = LoraConfig(r=int(lora_rank), lora_alpha=float(lora_alpha), lora_dropout=float(lora_dropout),
                        target_modules=targets, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config).eval()


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


def frozen_copy(model: Any) -> Any:
    """A no-grad copy of a full model: the reference for the KL loss."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


@contextlib.contextmanager
def reference_context(model: Any, reference: Any | None) -> Iterator[Any]:
    """The reference model to run: `reference` (full fine-tuning) or the LoRA model with its
    adapters disabled."""
    if reference is not None:
        yield reference
    elif is_lora(model):
        with model.disable_adapter():
            yield model
    else:
        raise ValueError("no reference model: full fine-tuning with use_kl_loss keeps a frozen copy")


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Full HF state-dict names -> tensors (detached; LoRA deltas merged into fresh tensors, the
    other entries share storage with the live parameters: copy them, do not keep them)."""
    if not is_lora(model):
        return {name: t.detach() for name, t in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            adapter = module.active_adapters[0]
            out[f"{name}.weight"] = (module.get_base_layer().weight + module.get_delta_weight(adapter)).detach()
    for name, tensor in base.state_dict().items():
        if "lora_" in name:
            continue
        out.setdefault(name.replace(".base_layer.", "."), tensor.detach())
    return out


def save_adapter(model: Any, directory: str) -> str:
    """Write the LoRA adapter as a peft folder (adapter_config.json + adapter_model.safetensors),
    atomically (temp folder renamed into place); returns the folder."""
    if not is_lora(model):
        raise ValueError("save_adapter needs a LoRA trainer (trainer.lora_rank > 0)")
    with atomic_dir(directory) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
    return str(directory)


def export_hf(model: Any, checkpoint_folder: str | None, directory: str) -> str:
    """Write the policy (LoRA merged) as a plain HF folder that transformers and vLLM load:
    config, model.safetensors and the checkpoint's tokenizer files; atomically."""
    base = model.get_base_model() if is_lora(model) else model
    return export_state(base.config, merged_state_dict(model), checkpoint_folder, directory)


def export_state(config: Any, state: dict[str, torch.Tensor], checkpoint_folder: str | None, directory: str) -> str:
    """`export_hf` from a state dict under HF names (a distributed trainer's gathered weights)
    and the model's HF config."""
    from transformers import AutoModelForCausalLM

    with atomic_dir(directory) as tmp:
        # built on the meta device and given the trained tensors (a strict load: every
        # parameter gets one): a model built on the CPU first draws random weights that the state
        # then replaces (3 s for SmolLM2-135M)
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(state, assign=True)
        plain.tie_weights()
        plain.save_pretrained(str(tmp), safe_serialization=True)
        for name in TOKENIZER_FILES if checkpoint_folder is not None else ():
            src = Path(checkpoint_folder) / name
            if src.is_file():
                shutil.copyfile(src, tmp / name)
    return str(directory)


# copied next to an exported policy so the folder is a complete model (weights + tokenizer)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "generation_config.json", "chat_template.jinja")
