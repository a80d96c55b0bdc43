"""Whether bfloat16 is fast on this machine's CPU, and the `auto` precision settings built on it.

bfloat16 halves the bytes of weights and activations, and where oneDNN has bfloat16 kernels
(AVX-512 BF16 or AMX; oneDNN emulates them on plain AVX-512) a bfloat16 matmul runs up to about
twice as fast as float32: the hf engine made ~2x the tokens/s and a training step was 1.6x
faster on such a CPU (docs/performance.md). Where it has none (a CPU with AVX2 only), PyTorch
falls back to a reference kernel: the engine's [32, 576] x [576, 1536] matmul took 50.6 ms in
bfloat16 against 0.72 ms in float32 on an AMD EPYC with AVX2 (70x slower). So the defaults say
`auto`: bfloat16 where it is fast, float32 elsewhere (`engine.dtype`, `trainer.bf16`).
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["AUTO", "fast_bfloat16", "resolve_bf16", "resolve_dtype"]

AUTO = "auto"


@functools.cache
def fast_bfloat16() -> bool:
    """True when this CPU runs bfloat16 matmuls on oneDNN's kernels (PyTorch's own check)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN, or the check renamed
        return False


def resolve_dtype(name: str) -> str:
    """`auto`: "bfloat16" where `fast_bfloat16()`, else "float32"; any other name unchanged."""
    if name != AUTO:
        return name
    return "bfloat16" if fast_bfloat16() else "float32"


def resolve_bf16(value: Any) -> Any:
    """`auto`: `fast_bfloat16()`; true / false (or anything else, for the caller to refuse) unchanged."""
    return fast_bfloat16() if value == AUTO else value
