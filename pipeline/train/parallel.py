"""What the trainer's loop asks of its process group: `LocalParallel` in one process (every
answer is the local one), `pipeline.train.distributed.strategy.TorchParallel` on N workers.

The loop (`PolicyGradientTrainer`) is the same code either way. Where N workers must agree it
asks its `Parallel`:
- `total(values)`: sums over the workers of numbers every worker has (the global batch's
  normalisers: token counts, sample counts), so each worker divides by the whole batch's;
- `most(values)`: per entry, the largest of any worker: every worker runs that many
  micro-batches and model calls per micro-batch (the forward passes of a sharded model are
  collectives, so their number must match; a worker with fewer runs empty ones that add nothing);
- `grad_scale`: gradients are averaged over the workers by DDP and FSDP2; a worker's loss is
  multiplied by the number of workers, so the average is the whole batch's sum;
- `clip_grad_norm(params, max_norm)`: the global gradient norm, clipped;
- `micro_batch_sync(last)`: DDP's `no_sync` for all but a step's last micro-batch;
- `train_forward(fn, *args)`: `fn(model, *args)` through the strategy's wrapper (DDP needs its
  forward called; FSDP2 and one process call the model directly);
- `combine(metrics)`: the step metrics of all workers, summed (each worker's share is its part
  of the batch mean), `grad_norm` taken as it is (it is global already).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Callable

import torch

__all__ = ["LocalParallel", "Parallel", "NOT_SUMMED"]

# metrics that are the same on every worker (global already), not shares of a sum
NOT_SUMMED = ("grad_norm",)


class Parallel:
    """The interface (module docstring); this base class is the one-process answer."""

    rank = 0
    world_size = 1

    @property
    def grad_scale(self) -> float:
        return float(self.world_size)

    def wrap(self, model: Any) -> Any:
        """The model the trainer keeps (FSDP2 shards it in place; one process: as it is)."""
        return model

    def reshard(self, model: Any) -> None:
        """After forward passes without backward: give back gathered parameters (FSDP2)."""

    def total(self, values: list[float]) -> list[float]:
        return [float(v) for v in values]

    def most(self, values: list[int]) -> list[int]:
        return [int(v) for v in values]

    def clip_grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    @contextlib.contextmanager
    def micro_batch_sync(self, last: bool) -> Iterator[None]:
        yield

    def train_forward(self, model: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(model, *args, **kwargs)

    def combine(self, metrics: dict[str, float]) -> dict[str, float]:
        return dict(metrics)


class LocalParallel(Parallel):
    """One process: the trainer as it always ran."""
