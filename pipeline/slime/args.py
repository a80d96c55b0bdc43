"""slime compatibility: constructor keywords from a slime args namespace, dotted-path imports."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline.data.errors import DataError
from pipeline.engines.assets import resolve_checkpoint
from pipeline.config.plugins import ConfigError, PluginImportError, allowed_targets, load_object

__all__ = ["kwargs_from_args", "tokenizer_from_args", "import_path"]


def tokenizer_from_args(args: Any) -> str | None:
    """The tokenizer folder named by `args.hf_checkpoint` (resolving the bundled model name)."""
    name = getattr(args, "hf_checkpoint", None)
    if name is None or Path(str(name)).is_dir():
        return name
    paths = getattr(args, "paths", None)
    return resolve_checkpoint(name, getattr(paths, "cache_dir", None) if paths is not None else None)


def import_path(dotted: str, args: Any = None) -> Any:
    """Import the plugin `pkg.mod.name` (a buffer filter named by slime's `buffer_filter_path`),
    inside the allowlist of `args` when it carries one; a failure names the path and the cause."""
    try:
        return load_object(dotted, allowed_targets(args), "buffer_filter_path")
    except (PluginImportError, ConfigError) as exc:
        raise DataError(str(exc)) from exc


def kwargs_from_args(args: Any) -> dict[str, Any]:
    """Constructor keywords from a slime-style args namespace (missing names: slime's defaults)."""
    # args is a user's slime namespace here, which may lack any of these names: slime's defaults apply
    get = lambda name, default=None: getattr(args, name, default)  # noqa: E731
    # slime's --disable-rollout-global-dataset (rollout_global_dataset=False): no prompt file
    prompt_data = get("prompt_data") if get("rollout_global_dataset", True) else None
    apply_ct = bool(get("apply_chat_template", False))
    max_len = get("rollout_max_prompt_len")
    tokenizer = tokenizer_from_args(args) if prompt_data and (apply_ct or max_len is not None) else None
    kwargs = get("apply_chat_template_kwargs") or {}
    if isinstance(kwargs, str):
        kwargs = json.loads(kwargs)
    save, load = get("save"), get("load")
    return {
        "prompt_data": prompt_data, "n_samples_per_prompt": get("n_samples_per_prompt"),
        "seed": get("rollout_seed", 42), "shuffle": bool(get("rollout_shuffle", False)),
        "input_key": get("input_key", "input"), "label_key": get("label_key"),
        "metadata_key": get("metadata_key", "metadata"), "tool_key": get("tool_key", "tools"),
        "apply_chat_template": apply_ct, "apply_chat_template_kwargs": dict(kwargs),
        "tokenizer": tokenizer, "max_prompt_len": max_len,
        "save_dir": os.path.join(save, "rollout") if save else None,
        "load_dir": os.path.join(load, "rollout") if load else None,
        "buffer_filter_path": get("buffer_filter_path"),
    }
