"""Which device a part computes on, and which torch.distributed backend goes with it.

`device: auto | cpu | cuda` (`trainer.device`, `engine.device`) is resolved once, at pre-flight
and again where the part is built (the same answer): `auto` takes CUDA when this process sees a
GPU, `cuda` with none is refused with a message naming the key. `backend: auto | gloo | nccl`
(`trainer.backend`): `auto` is NCCL on CUDA and gloo on CPU; NCCL asked for a CPU trainer is
refused (NCCL moves CUDA tensors only).

`visible_gpus()` counts GPUs without importing torch when it can (CUDA_VISIBLE_DEVICES, then
the NVIDIA driver's /proc entries), so a CPU-only machine answers a refused command fast;
`cuda_device_count()` asks torch (the authority) and is what building a part uses.

Which GPU the hf engine takes (`engine.colocate`): colocated, `cuda:0`, the GPU the trainer's
worker 0 gets too; else the last visible one (`cuda:{n-1}`) of its own, and the trainer's workers
get the other n-1 (`engine_gpu_index`, `gpus_for_trainer`). The process-level CPU tunings
(`omp_spin_count`, `keep_freed_memory`) switch off when nothing in the run's own process computes
on the CPU (`process_cpu_idle`, decided torch-free before torch loads).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["BACKENDS", "DEVICES", "DeviceError", "FUNCTION_TRAINER", "HF_ENGINE", "cuda_device_count",
           "cpu_tuning_note", "engine_gpu_index", "gpu_mask", "gpus_for_trainer", "process_cpu_idle",
           "process_tuning_note", "resolve_backend", "resolve_device", "visible_gpus"]

logger = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")

# the in-process engine and the trainer that owns its own model (`process_cpu_idle`)
HF_ENGINE = "pipeline.engines.hf.HFEngine"
FUNCTION_TRAINER = "pipeline.train.function.FunctionTrainer"

_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
_NVIDIA_DEVICE = Path("/dev/nvidiactl")


class DeviceError(ValueError):
    """A device or backend setting this machine cannot honour (the message names the key)."""


def visible_gpus() -> int | None:
    """GPUs this process may use, without importing torch: 0 when CUDA_VISIBLE_DEVICES hides them
    all (empty, or starting with -1) or no NVIDIA driver is installed; the driver's count of GPUs
    capped by CUDA_VISIBLE_DEVICES where /proc lists them; None when only torch can tell (a
    driver's device node without its /proc listing, as in some containers)."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    allowed: int | None = None
    if mask is not None:
        allowed = 0
        for x in (x.strip() for x in mask.split(",")):
            if not x or x.startswith("-"):  # CUDA stops at the first invalid entry
                break
            allowed += 1
        if allowed == 0:
            return 0
    if _NVIDIA_GPUS.is_dir():
        listed = len(list(_NVIDIA_GPUS.iterdir()))
        return listed if allowed is None else min(listed, allowed)
    if not _NVIDIA_DEVICE.exists():
        return 0
    return None


def cuda_device_count() -> int:
    """torch's count of usable CUDA devices (0 on a CPU build or without a driver)."""
    if visible_gpus() == 0:
        return 0  # no driver, or every GPU hidden: torch would say 0 too, after a 2 s import
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def gpu_mask() -> str:
    """CUDA_VISIBLE_DEVICES as an error message shows it: its value, or that it is not set."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES is not set" if mask is None else f"CUDA_VISIBLE_DEVICES={mask!r}"


def resolve_device(choice: object, key: str, gpus: int | None = None) -> str:
    """"cpu" or "cuda" for the setting `choice` of `key` (e.g. "trainer.device"); `gpus` is the
    GPU count to judge by (None: `cuda_device_count()`)."""
    if choice not in DEVICES:
        raise DeviceError(f"{key}={choice!r}: expected one of {list(DEVICES)}")
    if choice == "cpu":
        return "cpu"
    count = cuda_device_count() if gpus is None else gpus
    if choice == "cuda" and count == 0:
        raise DeviceError(f"{key}=cuda, but this machine has no CUDA device torch can use "
                          f"({gpu_mask()}); use {key}=cpu or {key}=auto")
    return "cuda" if count > 0 else "cpu"


def resolve_backend(choice: object, device: str, key: str = "trainer.backend") -> str:
    """The torch.distributed backend for `device` ("cpu" | "cuda"): auto -> nccl on CUDA, gloo
    on CPU; nccl on CPU is refused."""
    if choice not in BACKENDS:
        raise DeviceError(f"{key}={choice!r}: expected one of {list(BACKENDS)}")
    if choice == "auto":
        return "nccl" if device == "cuda" else "gloo"
    if choice == "nccl" and device != "cuda":
        raise DeviceError(f"{key}=nccl needs CUDA tensors, but the trainer runs on the CPU; use {key}=gloo "
                          f"(or auto), or trainer.device=cuda on a machine with GPUs")
    return str(choice)


def cpu_tuning_note(part: str, device: str) -> str | None:
    """The one log line of a CPU-only tuning (`part`, e.g. "engine.native_kernels") that switches
    itself off because its part computes on `device`; None on the CPU (it stays on)."""
    if device == "cpu":
        return None
    return f"{part}: off ({device} device; it tunes CPU compute only)"


def engine_gpu_index(visible: int, colocate: bool) -> int:
    """The GPU index of the hf engine on CUDA among `visible` GPUs: 0 colocated with the
    trainer's worker 0 (`engine.colocate=true`), else the last one, `visible - 1`, of its own."""
    if visible < 1:
        raise DeviceError(f"engine.device resolves to cuda, but no GPU is visible ({gpu_mask()}); "
                          "use engine.device=cpu")
    return 0 if colocate else visible - 1


def gpus_for_trainer(visible: int, engine_on_own_gpu: bool) -> int:
    """GPUs left to a trainer on CUDA among `visible`: all of them, or all but the engine's own
    last one (`engine_on_own_gpu`: the hf engine on CUDA with `engine.colocate=false`)."""
    left = visible - 1 if engine_on_own_gpu else visible
    if left >= 1:
        return left
    if engine_on_own_gpu and visible == 1:
        raise DeviceError("trainer.device resolves to cuda, but this machine has 1 GPU and the hf engine takes it "
                          "for itself (engine.colocate=false gives the engine the last GPU); set engine.colocate=true "
                          "to share cuda:0 with the trainer's worker 0, or trainer.device=cpu / engine.device=cpu")
    raise DeviceError(f"trainer.device resolves to cuda, but no GPU is visible ({gpu_mask()}); use trainer.device=cpu")


def process_tuning_note(part: str, reason: str) -> str:
    """The one log line of a process-level CPU tuning (`omp_spin_count`, `keep_freed_memory`) that
    switches itself off: `reason` says why nothing in this process computes on the CPU."""
    return f"{part}: off ({reason}; it tunes CPU compute only)"


def process_cpu_idle(engine: Any, trainer: Any, gpus: int | None) -> str | None:
    """Why nothing in the run's own process computes on the CPU, or None when something may.

    Nothing does when the engine is the hf engine on CUDA and the trainer is absent
    (`trainer=none`, or a function trainer owning its model), trains in other processes
    (`trainer.num_workers > 1`) or trains on CUDA (`trainer.device`). `engine` and `trainer` are
    the config nodes (plain or OmegaConf mappings); `gpus` the torch-free `visible_gpus()`
    count, so `auto` counts as CUDA only where it is known to be there. Anything unknown or
    invalid (pre-flight refuses it) counts as CPU: the tunings stay on, as on a CPU machine."""
    if not isinstance(engine, Mapping) or engine.get("_target_") != HF_ENGINE:
        return None
    if _device_torch_free(engine.get("device"), gpus) != "cuda":
        return None
    trainer = trainer if isinstance(trainer, Mapping) else {}
    target, path = trainer.get("_target_"), trainer.get("path")
    if not (target or path) or target == FUNCTION_TRAINER:
        return "nothing in this process computes on the CPU: the hf engine runs on cuda and no trainer computes in it"
    workers = trainer.get("num_workers")
    if isinstance(workers, int) and not isinstance(workers, bool) and workers > 1:
        return (f"nothing in this process computes on the CPU: the hf engine runs on cuda and the trainer's "
                f"{workers} workers are processes of their own")
    if _device_torch_free(trainer.get("device"), gpus) == "cuda":
        return "nothing in this process computes on the CPU: the hf engine and the trainer run on cuda"
    return None


def _device_torch_free(choice: Any, gpus: int | None) -> str | None:
    """"cpu" or "cuda" for a device setting without asking torch; None when only torch can tell
    (`auto` with an unknown GPU count) or the value is not a device (pre-flight refuses it)."""
    if choice in ("cpu", "cuda"):
        return str(choice)
    if choice == "auto" and gpus is not None:
        return "cuda" if gpus > 0 else "cpu"
    return None
