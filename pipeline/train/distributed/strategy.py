"""The trainer's process group on a worker: FSDP2 or DDP over torch.distributed, and the answers
of `pipeline.train.parallel.Parallel` that need the group.

- `fsdp2`: every module whose class is in `wrap_modules` (default: the model's
  `_no_split_modules`, e.g. LlamaDecoderLayer) is sharded with `fully_shard` on a 1-D
  `DeviceMesh` of all workers, then the whole HF model (embeddings, final norm, head) as the
  root; parameters, gradients and AdamW state are DTensor shards. On a gloo group the units
  gather and reduce through `gloo_comm` (`trainer.gloo_collectives`: gloo's broadcast and
  all-reduce, several times faster there than its all-gather and reduce-scatter). The mesh is
  built on the trainer's device type ("cpu" for gloo: a gloo group on a machine with GPUs must not see CUDA
  weights, pytorch issue 132471). A peft model is sharded inside (its HF base model is the
  root), so peft's own API (adapters on and off) keeps working.
- `ddp`: `DistributedDataParallel` around `_Apply`, a module whose forward is "call this
  function on the model": one DDP forward per micro-batch however many times the function
  calls the model (the shared-prompt pass calls it once per prompt pass and response pass).
  Frozen copies (the KL reference) are not wrapped (they take no gradients).

Both average gradients over the workers; `grad_scale` (the world size) multiplied into each
worker's loss turns that average into the sum over the whole batch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Callable

import torch
import torch.distributed as dist

from pipeline.train.distributed.gloo_comm import GLOO_COLLECTIVES, install as install_gloo_collectives
from pipeline.train.parallel import NOT_SUMMED, Parallel

__all__ = ["PARAM_DTYPES", "STRATEGIES", "TorchParallel", "wrap_classes"]

logger = logging.getLogger(__name__)

STRATEGIES = ("fsdp2", "ddp")
PARAM_DTYPES = ("float32", "bfloat16")


class _Apply(torch.nn.Module):
    """`forward(fn, *args)` = `fn(model, *args)`: what DDP wraps (module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(self.model, *args, **kwargs)


def hf_model(model: Any) -> Any:
    """The transformers model inside `model` (a peft model's base model; else itself)."""
    return model.get_base_model() if hasattr(model, "peft_config") else model


def wrap_classes(model: Any, wrap_modules: list[str] | None) -> list[str]:
    """The module class names FSDP2 shards as units; refuses a model it cannot split."""
    names = list(wrap_modules) if wrap_modules else list(getattr(hf_model(model), "_no_split_modules", None) or [])
    found = {type(m).__name__ for m in model.modules()}
    if not names:
        raise ValueError(f"trainer.strategy=fsdp2: {type(hf_model(model)).__name__} names no layer class to shard "
                         f"(no _no_split_modules); set trainer.fsdp_wrap_modules=[<its decoder layer class>] or use "
                         f"trainer.strategy=ddp")
    missing = [n for n in names if n not in found]
    if missing or not any(n in found for n in names):
        raise ValueError(f"trainer.strategy=fsdp2: {type(hf_model(model)).__name__} has no module of class "
                         f"{missing or names} to shard (its classes include "
                         f"{sorted(n for n in found if 'Layer' in n or 'Block' in n)[:8]}); set "
                         f"trainer.fsdp_wrap_modules to one of them, or use trainer.strategy=ddp")
    return names


class TorchParallel(Parallel):
    """`Parallel` over the default torch.distributed process group (already initialised)."""

    def __init__(self, strategy: str, device: torch.device, wrap_modules: list[str] | None = None,
                 reshard_after_forward: bool = True, param_dtype: str = "float32",
                 gloo_collectives: str = "broadcast") -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"trainer.strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
        self.strategy = strategy
        self.device = device
        self.wrap_modules = wrap_modules
        self.reshard_after_forward = bool(reshard_after_forward)
        if param_dtype not in PARAM_DTYPES:
            raise ValueError(f"trainer.param_dtype must be one of {list(PARAM_DTYPES)}, got {param_dtype!r}")
        if param_dtype != "float32" and strategy != "fsdp2":
            raise ValueError(f"trainer.param_dtype={param_dtype} needs trainer.strategy=fsdp2 (FSDP2's mixed "
                             f"precision); with {strategy} use trainer.bf16=true (autocast)")
        self.param_dtype = param_dtype
        if gloo_collectives not in GLOO_COLLECTIVES:
            raise ValueError(f"trainer.gloo_collectives must be one of {list(GLOO_COLLECTIVES)}, "
                             f"got {gloo_collectives!r}")
        self.gloo_collectives = gloo_collectives
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        # tensors of the collectives below live where the backend moves them from
        self._comm_device = torch.device("cuda", torch.cuda.current_device()) \
            if dist.get_backend() == "nccl" else torch.device("cpu")
        self._mesh: Any = None
        self._ddp: Any = None

    @property
    def mesh(self) -> Any:
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.device.type, (self.world_size,))
        return self._mesh

    def wrap(self, model: Any) -> Any:
        trainable = any(p.requires_grad for p in model.parameters())
        if self.strategy == "fsdp2":
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            names = set(wrap_classes(model, self.wrap_modules))
            options: dict[str, Any] = {"mesh": self.mesh, "reshard_after_forward": self.reshard_after_forward}
            if self.param_dtype == "bfloat16":
                options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            units = [fully_shard(module, **options) for module in list(model.modules())
                     if type(module).__name__ in names]
            units.append(fully_shard(hf_model(model), **options))
            if dist.get_backend() == "gloo":
                install_gloo_collectives(units, self.gloo_collectives)
            return model
        if trainable:
            ids = [self.device.index if self.device.index is not None else torch.cuda.current_device()] \
                if self.device.type == "cuda" else None
            # buffers (rotary frequencies) are the same everywhere: no broadcast per forward
            self._ddp = torch.nn.parallel.DistributedDataParallel(_Apply(model), device_ids=ids,
                                                                  broadcast_buffers=False)
        return model

    def reshard(self, model: Any) -> None:
        """FSDP2 without resharding after forward keeps a module's gathered parameters until
        its backward; a forward without one (old / reference log-probs) lets them go here."""
        if self.strategy == "fsdp2" and not self.reshard_after_forward:
            from torch.distributed.fsdp import FSDPModule

            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    def total(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return [float(x) for x in t.tolist()]

    def most(self, values: list[int]) -> list[int]:  # type: ignore[override]
        t = torch.tensor(values, dtype=torch.int64, device=self._comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [int(x) for x in t.tolist()]

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        full = getattr(norm, "full_tensor", None)  # FSDP2: a DTensor, the norm over every shard
        return float(full() if callable(full) else norm)

    @contextlib.contextmanager
    def micro_batch_sync(self, last: bool) -> Iterator[None]:
        if self._ddp is not None and not last:
            with self._ddp.no_sync():
                yield
        else:
            yield

    def train_forward(self, model: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._ddp is not None:
            return self._ddp(fn, *args, **kwargs)
        return fn(model, *args, **kwargs)

    def combine(self, metrics: dict[str, float]) -> dict[str, float]:
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, metrics)
        out: dict[str, float] = {}
        for part in parts:  # rank order: every worker gets the same sums
            for key, value in part.items():
                out[key] = out.get(key, 0.0) + float(value)
        for key in NOT_SUMMED:
            if key in metrics:
                out[key] = float(parts[0][key])
        return out
