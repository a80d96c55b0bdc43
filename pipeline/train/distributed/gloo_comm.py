"""FSDP2's two collectives on a gloo group, through torch's own extension point for them.

FSDP2 gathers each unit's parameters with `all_gather_single` and reduces its gradients with
`reduce_scatter_single`. gloo implements those two far slower than its broadcast and
all-reduce: on the 2-core CPU machine, over loopback, 128 MB per rank took 0.58 s to all-gather
and 0.62 s to reduce-scatter, against 0.10 s to broadcast and 0.20 s to all-reduce
(docs/performance.md, "Distributed trainer"). `trainer.gloo_collectives: broadcast` installs
these two implementations with `FSDPModule.set_custom_all_gather` / `set_custom_reduce_scatter`
(torch's `Comm` interface; torch 2.13 keeps it in the private module
torch.distributed.fsdp._fully_shard._fsdp_api, so a torch that moves it fails at import): they
call only torch.distributed's own collectives, so no bytes move outside gloo.

- all-gather: rank r's shard is `output[r * n : (r + 1) * n]`; one `broadcast` per rank, each
  from its owner into that slice (the same bytes as the all-gather);
- reduce-scatter: one `all_reduce` of the whole input, then this rank's slice of it (twice the
  bytes, still faster). Bit-identical to gloo's reduce-scatter for 2 ranks (a + b in either
  order) and, as measured, for 3 (tests/train/test_gloo_comm_groups.py); nothing promises that
  gloo sums more ranks in the same order, so there the last bit may differ.

Both run synchronously and return None (no `Work`): FSDP2 then waits for nothing, as it does for
gloo on CPU, where nothing overlaps a collective anyway. NCCL groups keep FSDP2's defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

__all__ = ["GLOO_COLLECTIVES", "BroadcastAllGather", "AllReduceScatter", "install"]

GLOO_COLLECTIVES = ("broadcast", "native")


class _Plain:
    """Buffers from the ordinary allocator (what FSDP2's default comms use)."""

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class BroadcastAllGather(_Plain, AllGather):
    """all_gather_single as one broadcast per rank of the group (module docstring)."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> None:
        size = dist.get_world_size(group)
        n = input_tensor.numel()
        if output_tensor.numel() != size * n:
            raise ValueError(f"all-gather: output of {output_tensor.numel()} elements for {size} ranks x {n}")
        flat = output_tensor.view(-1)
        me = dist.get_rank(group)
        flat[me * n:(me + 1) * n].copy_(input_tensor.reshape(-1))
        for r in range(size):
            dist.broadcast(flat[r * n:(r + 1) * n], src=dist.get_global_rank(group, r), group=group)
        return None


class AllReduceScatter(_Plain, ReduceScatter):
    """reduce_scatter_single as an all-reduce of the whole input, then this rank's slice."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> None:
        size = dist.get_world_size(group)
        n = output_tensor.numel()
        if input_tensor.numel() != size * n:
            raise ValueError(f"reduce-scatter: input of {input_tensor.numel()} elements for {size} ranks x {n}")
        dist.all_reduce(input_tensor, op=op, group=group)
        me = dist.get_rank(group)
        output_tensor.view(-1).copy_(input_tensor.view(-1)[me * n:(me + 1) * n])
        return None


def install(modules: list[Any], choice: str) -> int:
    """Give every FSDP2 unit in `modules` the gloo collectives `choice` names; returns how many
    units got them (0 for `native`)."""
    if choice not in GLOO_COLLECTIVES:
        raise ValueError(f"trainer.gloo_collectives must be one of {list(GLOO_COLLECTIVES)}, got {choice!r}")
    if choice == "native":
        return 0
    gather, scatter = BroadcastAllGather(), AllReduceScatter()
    for module in modules:
        module.set_custom_all_gather(gather)
        module.set_custom_reduce_scatter(scatter)
    return len(modules)
