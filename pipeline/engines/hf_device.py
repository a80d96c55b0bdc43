"""Where the `hf` engine computes: `engine.device`, `engine.colocate`, and what CUDA switches off.

- `engine_device`: "cpu", or "cuda:<index>" (`auto` takes CUDA when torch sees a GPU; `cuda`
  with none is refused naming the key). On CUDA the engine takes `cuda:0` with
  `engine.colocate=true` (the GPU the trainer's worker 0 gets too) and the last visible GPU,
  `cuda:{n-1}`, of its own otherwise (`pipeline.cluster.devices.engine_gpu_index`). Inside a Ray
  replica, Ray's CUDA_VISIBLE_DEVICES shows one GPU: `cuda:0` either way.
- `engine_dtype`: `dtype: auto` on CUDA is bfloat16 (GPUs run it natively); on the CPU it is
  `pipeline.process.precision`'s choice, which is about this CPU's kernels.
- `cpu_only`: the CPU-only speed-ups (`packed_matmuls`, oneDNN's blocked weights;
  `native_kernels`, the AVX-512 C kernels) stay as configured on the CPU and switch themselves off
  on CUDA with one log line each (`pipeline.cluster.devices.cpu_tuning_note`).

The static decode path stays on CUDA: its lean step runs the plain PyTorch ops there, on tensors
made on the model's device (`pipeline.engines.hf_lean`, `hf_static`, `hf_sampling`).
"""

from __future__ import annotations

import logging

from pipeline.cluster import devices
from pipeline.process.precision import AUTO, resolve_dtype

__all__ = ["cpu_only", "engine_device", "engine_dtype"]

logger = logging.getLogger(__name__)


def engine_device(choice: object, colocate: bool, gpus: int | None = None) -> str:
    """"cpu" or "cuda:<index>" for `engine.device=choice` and `engine.colocate=colocate`;
    `gpus` is the GPU count to judge by (None: torch's, `devices.cuda_device_count()`)."""
    if devices.resolve_device(choice, "engine.device", gpus) == "cpu":
        return "cpu"
    count = devices.cuda_device_count() if gpus is None else gpus
    return f"cuda:{devices.engine_gpu_index(count, colocate)}"


def engine_dtype(dtype: str, device: str) -> str:
    """The dtype name the engine loads its model in: `auto` is bfloat16 on a GPU and
    `pipeline.process.precision.resolve_dtype`'s CPU choice on the CPU; any other name unchanged."""
    if dtype == AUTO and device != "cpu":
        return "bfloat16"
    return resolve_dtype(dtype)


def cpu_only(part: str, enabled: bool, device: str) -> bool:
    """`enabled` on the CPU; False on another device, saying so in one log line when it was on
    (`part`: the engine key, e.g. "packed_matmuls")."""
    if not enabled or device == "cpu":
        return enabled
    note = devices.cpu_tuning_note(f"engine.{part}", device.partition(":")[0])
    logger.info("hf engine: %s", note)
    return False
