"""Fused bfloat16 kernels for the static decode step, in C, built once with the machine's compiler.

`hf_lean.LeanDecoder(native=load(...))` runs each layer's work between its four matmuls through
three C functions (`native/lean_kernels.c`) instead of about 25 PyTorch ops: the residual add
with the RMSNorm, RoPE with the cache write and the attention, and SiLU times up. A fourth
samples the next tokens (`NativeKernels.sample`, used by `hf_sampling.sample_batch`). At batch
32 the PyTorch ops took about as long as the matmuls (PyTorch's CPU flash attention re-packs the
cache slice for its AMX micro-kernels on every call; each small op is a dispatch and a pass over
memory), and the PyTorch sampler 5-10 ms per step; docs/performance.md has the measurements.

Arithmetic: the same as the PyTorch ops in bfloat16 (float32 inside, every intermediate that
PyTorch rounds to bfloat16 rounded the same way, round to nearest even), except that sums are
taken in another order (RMSNorm's mean of squares, the attention's dot products), exp is a
polynomial (relative error below 2e-7, against PyTorch's vectorised exp) and the attention keeps
its probabilities in float32 where PyTorch's flash kernel rounds them to bfloat16 before
multiplying the values. So the logits differ from the PyTorch path's by bfloat16 rounding
(`tests/engines/test_native_kernels.py` states the bound it checks). The sampler takes the same
draws and does the same two-level search as the PyTorch sampler, with float32 exponentials from
the same polynomial; over 640 test rows it picked the same tokens.

Built with `cc -O3 -mavx512f -mavx512bw -mfma -fopenmp` into `<cache_dir>/native/` (the file
name carries a hash of the source, the flags and the compiler's version, so an edit rebuilds;
written to a temp file, then renamed, so two processes building at once both end with a whole
file). Available where the CPU has AVX-512 and a C compiler is found (`CC`, else `cc`, else
`gcc`); `unavailable_reason()` says why not, and the engine then keeps the PyTorch ops. The
OpenMP regions use the calling thread's team of PyTorch's libgomp (the library is loaded once
per process, by its soname), so the `omp_spin_count` settings apply to them too.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

__all__ = ["NativeKernels", "load", "unavailable_reason"]

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "lean_kernels.c"
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mfma", "-fopenmp", "-fPIC", "-shared")

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "lean_add_rms_norm": [_P, _P, _P, _P, _I, _I, _F, ctypes.c_int],
    "lean_silu_mul": [_P, _P, _I, _I, ctypes.c_int],
    "lean_rope_attention": [_P, _I, _P, _P, _P, _P, _I, _I, _P, _I, _P, _I, _I, _I, _I, _I, _I, _F,
                            ctypes.c_int],
    "lean_sample": [_P, _I, _I, _P, _P, _P, _P, ctypes.c_int],
}
_loaded: dict[Path, NativeKernels] = {}
_load_lock = threading.Lock()


def compiler() -> str | None:
    """The C compiler: `$CC`, else `cc`, else `gcc` on PATH (None when none is found)."""
    named = os.environ.get("CC")
    if named:
        return shutil.which(named)
    return shutil.which("cc") or shutil.which("gcc")


def unavailable_reason() -> str | None:
    """None when the kernels can be built and run here, else why not."""
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):
        return f"the CPU has no AVX-512 (PyTorch reports {capability})"
    if compiler() is None:
        return "no C compiler found (set CC, or install gcc)"
    if not SOURCE.is_file():
        return f"the kernels' source {SOURCE} is missing from this installation"
    return None


class NativeKernels:
    """The functions of `native/lean_kernels.c`: three decode-step kernels on bfloat16 tensors
    and the sampler on float32 logits."""

    def __init__(self, library: Path) -> None:
        self.path = library
        lib = ctypes.CDLL(str(library))
        for name, args in _SIGNATURES.items():
            getattr(lib, name).argtypes = args
            getattr(lib, name).restype = None
        self._norm, self._silu, self._attn = lib.lean_add_rms_norm, lib.lean_silu_mul, lib.lean_rope_attention
        self._sample = lib.lean_sample

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     out: torch.Tensor, eps: float) -> None:
        """x += delta (in place, rounded to bfloat16; delta None: x unchanged), then out = the
        RMSNorm of x times weight. x, delta, out: contiguous [rows, hidden]; hidden % 16 == 0."""
        self._norm(x.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(),
                   out.data_ptr(), x.shape[0], x.shape[1], eps, torch.get_num_threads())

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        """out = silu(gate) * up for gate_up = [gate | up]: [rows, 2 I] -> [rows, I]; I % 16 == 0."""
        self._silu(gate_up.data_ptr(), out.data_ptr(), out.shape[0], out.shape[1], torch.get_num_threads())

    def rope_attention(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                       values: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, heads: int,
                       column: int, start: int, scale: float) -> None:
        """RoPE on the q and k of `qkv` [rows, (heads + 2 kv_heads) * dim], the new key and value
        written at `column` of `keys` / `values` [>= rows, kv_heads, columns, dim] (last two dims
        contiguous), and attention over columns start..column with `bias` [rows, column + 1 -
        start] added to the scores (as `hf_lean.decode_layer`); out: [rows, heads * dim]."""
        rows, kv_heads, dim = qkv.shape[0], keys.shape[1], keys.shape[3]
        self._attn(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(), keys.data_ptr(),
                   values.data_ptr(), keys.stride(0), keys.stride(1), bias.data_ptr(), bias.stride(0),
                   out.data_ptr(), rows, heads, kv_heads, dim, column, start, scale, torch.get_num_threads())

    def sample(self, logits: torch.Tensor, temperatures: torch.Tensor,
               draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row of float32 `logits` [rows, vocab] and its log-prob, as
        `hf_sampling.sample_batch` without top-k / top-p: temperature <= 0 takes the argmax,
        else inverse-CDF sampling of softmax(logits / temperature) with the row's draw in [0, 1)
        (float64 `draws`, one per row; greedy rows ignore theirs). Returns ([rows] long tokens,
        [rows] float32 log_softmax(logits / temperature)[token], temperature 1 for greedy rows)."""
        logits = logits.contiguous()
        rows, vocab = logits.shape
        temperatures = temperatures.to(torch.float32).contiguous()
        draws = draws.to(torch.float64).contiguous()
        tokens = torch.empty(rows, dtype=torch.long)
        log_probs = torch.empty(rows, dtype=torch.float32)
        self._sample(logits.data_ptr(), rows, vocab, temperatures.data_ptr(), draws.data_ptr(), tokens.data_ptr(),
                     log_probs.data_ptr(), torch.get_num_threads())
        return tokens, log_probs


@functools.cache
def _compiler_version(cc: str) -> str:
    return subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout


def _library_path(cache_dir: Path, cc: str) -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + repr((FLAGS, _compiler_version(cc))).encode()).hexdigest()[:16]
    return cache_dir / "native" / f"lean_kernels-{digest}.so"


def _build(cc: str, target: Path) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=".so")
    except OSError as exc:
        raise RuntimeError(f"cannot build the native decode kernels into {target.parent}: {exc}") from exc
    os.close(fd)
    try:
        done = subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"building {SOURCE} with {cc} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(cache_dir: str | os.PathLike[str]) -> NativeKernels:
    """The kernels, built into `<cache_dir>/native/` on first use (about a second). Raises
    RuntimeError with the reason where they are unavailable or the build fails."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"native decode kernels unavailable: {reason}")
    cc = compiler()
    assert cc is not None  # unavailable_reason checked it
    target = _library_path(Path(cache_dir), cc)
    with _load_lock:
        if target not in _loaded:
            if not target.exists():
                logger.info("building the native decode kernels: %s", target)
                _build(cc, target)
            try:
                _loaded[target] = NativeKernels(target)
            except OSError as exc:  # a damaged file, a library this machine cannot load
                raise RuntimeError(f"loading the native decode kernels {target} failed: {exc}") from exc
        return _loaded[target]
