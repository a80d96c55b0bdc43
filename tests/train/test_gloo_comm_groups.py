"""pipeline/train/distributed/gloo_comm.py on real gloo groups of 2 and 3 processes
(torch.multiprocessing): the results are bit-identical to gloo's own `all_gather_into_tensor` /
`reduce_scatter_tensor` (float32 and bfloat16, AVG and SUM, sizes that are not round), and each
FSDP2 unit of a 2-rank model gathers and reduces through them (unless `native`). The module's
logic in this process, where mutation testing sees it, is in tests/train/test_gloo_comm.py.
"""

from __future__ import annotations

import gc
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.train.distributed.gloo_comm import AllReduceScatter, BroadcastAllGather
from tests.train.trainer_fixtures import free_port, tiny_llama


def _leave() -> None:
    """Free what holds the group (sharded models, their pending gloo work) and leave together.
    A ProcessGroupGloo that outlives `destroy_process_group` (a sharded model's mesh keeps it) is
    freed during interpreter finalisation, and its worker threads abort the process (SIGABRT,
    "terminate called without an active exception": CI saw it under load; pytorch PR 179291)."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()


def _against_gloo(rank: int, size: int, port: int, errors) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
        g = dist.group.WORLD
        for dtype in (torch.float32, torch.bfloat16):
            for n in (1, 7, 1000):
                x = torch.randn(n, generator=torch.Generator().manual_seed(10 * rank + n)).to(dtype)
                want = torch.empty(size * n, dtype=dtype)
                dist.all_gather_into_tensor(want, x)
                got = torch.full((size * n,), float("nan"), dtype=dtype)
                assert BroadcastAllGather()(got, x, g) is None
                assert torch.equal(got, want), (dtype, n)
                for op in (dist.ReduceOp.AVG, dist.ReduceOp.SUM):
                    y = torch.randn(size * n, generator=torch.Generator().manual_seed(rank + n)).to(dtype)
                    want = torch.empty(n, dtype=dtype)
                    dist.reduce_scatter_tensor(want, y.clone(), op=op)
                    got = torch.full((n,), float("nan"), dtype=dtype)
                    assert AllReduceScatter()(got, y.clone(), g, op) is None
                    assert torch.equal(got, want), (dtype, n, op)
        _leave()
    except BaseException:  # noqa: BLE001 - reported to the parent
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise


@pytest.mark.parametrize("size", [2, 3])
def test_results_are_bit_identical_to_gloos_own_collectives(size):
    errors = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_against_gloo, args=(size, free_port(), errors), nprocs=size, start_method="spawn")
    assert errors.empty(), errors.get()


def _fsdp2_units_use_them(rank: int, port: int, errors) -> None:
    try:
        from pipeline.train.distributed.strategy import TorchParallel

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        calls = {"broadcast": 0, "all_reduce": 0, "all_gather_single": 0, "reduce_scatter_single": 0}
        for name in calls:
            real = getattr(dist, name)

            def counted(*a, _real=real, _name=name, **k):
                calls[_name] += 1
                return _real(*a, **k)
            setattr(dist, name, counted)
        for choice in ("broadcast", "native"):
            for key in calls:
                calls[key] = 0
            model = tiny_llama(torch.float32)
            TorchParallel("fsdp2", torch.device("cpu"), gloo_collectives=choice).wrap(model)
            loss = model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum()
            loss.backward()
            if choice == "broadcast":
                # 3 units (2 layers + the root), gathered for the forward and again for the
                # backward: one broadcast per rank each; one all-reduce per unit's gradients
                assert calls == {"broadcast": 3 * 2 * 2, "all_reduce": 3, "all_gather_single": 0,
                                 "reduce_scatter_single": 0}, calls
            else:
                assert calls["broadcast"] == 0 and calls["all_reduce"] == 0, calls
                assert calls["all_gather_single"] == 6 and calls["reduce_scatter_single"] == 3, calls
            del model, loss
        _leave()
    except BaseException:  # noqa: BLE001
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise


def test_every_fsdp2_unit_of_a_gloo_group_gathers_and_reduces_through_them_unless_native():
    errors = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_fsdp2_units_use_them, args=(free_port(), errors), nprocs=2, start_method="spawn")
    assert errors.empty(), errors.get()
