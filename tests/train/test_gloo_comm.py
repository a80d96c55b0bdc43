"""pipeline/train/distributed/gloo_comm.py in this process (what mutation testing sees: a spawned
child imports the module anew), with stand-ins for the collectives playing the other ranks: which
slice each rank sends and keeps, the global ranks broadcasts come from, the refusals, and a
one-rank FSDP2 model's units using them. On real 2- and 3-process gloo groups, against gloo's own
collectives: tests/train/test_gloo_comm_groups.py.
"""

from __future__ import annotations

import re

import pytest
import torch

from pipeline.train.distributed import gloo_comm
from pipeline.train.distributed.gloo_comm import AllReduceScatter, BroadcastAllGather, install
from tests.train.trainer_fixtures import group, tiny_llama  # noqa: F401  (fixture)


# -- in this process, the other ranks played by stand-ins ------------------------------------------


GROUP = object()  # the process group the comm is handed; every collective must get this one


class _Peers:
    """A group of `size` ranks seen from rank `me` (global ranks 10 + r): broadcasts from a peer
    write that peer's shard, all-reduces add the peers' inputs; each call checks that it is asked
    about the group the comm was given (GROUP), never the default one."""

    def __init__(self, monkeypatch, size: int, me: int, shards: dict[int, torch.Tensor]) -> None:
        self.broadcasts: list[tuple[int, torch.Tensor]] = []
        self.shards, self.me, self.size = shards, me, size
        for name in ("get_world_size", "get_rank", "get_global_rank", "broadcast", "all_reduce"):
            monkeypatch.setattr(gloo_comm.dist, name, getattr(self, name))

    def get_world_size(self, group):
        assert group is GROUP
        return self.size

    def get_rank(self, group):
        assert group is GROUP
        return self.me

    def get_global_rank(self, group, r):
        assert group is GROUP
        return 10 + r

    def broadcast(self, t, src, group=None):
        assert group is GROUP
        self.broadcasts.append((src, t.clone()))
        if src - 10 != self.me:
            t.copy_(self.shards[src - 10])

    def all_reduce(self, t, op=None, group=None):
        assert group is GROUP
        self.op = op
        for r, peer in self.shards.items():
            if r != self.me:
                t += peer


@pytest.mark.parametrize("me", [0, 1, 2])
def test_all_gather_puts_each_ranks_shard_in_its_slice_broadcast_from_its_owner(monkeypatch, me):
    shards = {r: torch.arange(4, dtype=torch.float32) + 10 * r for r in range(3)}
    peers = _Peers(monkeypatch, 3, me, shards)
    out = torch.full((3, 4), -1.0)  # FSDP2's output may come shaped; the slices are of its flat view
    assert BroadcastAllGather()(out, shards[me].reshape(2, 2), GROUP) is None
    assert torch.equal(out.reshape(-1), torch.cat([shards[r] for r in range(3)]))
    assert [src for src, _ in peers.broadcasts] == [10, 11, 12]
    # this rank sends its own shard, already in place
    assert torch.equal(peers.broadcasts[me][1], shards[me])


@pytest.mark.parametrize("me", [0, 1])
def test_reduce_scatter_all_reduces_the_whole_input_and_keeps_this_ranks_slice(monkeypatch, me):
    inputs = {r: torch.arange(6, dtype=torch.float32) * (r + 1) for r in range(2)}
    peers = _Peers(monkeypatch, 2, me, inputs)
    out = torch.full((3,), -1.0)
    op = object()
    assert AllReduceScatter()(out, inputs[me].clone(), GROUP, op) is None
    total = inputs[0] + inputs[1]
    assert torch.equal(out, total[3 * me:3 * me + 3]) and peers.op is op


def test_sizes_that_do_not_fit_the_group_are_refused(monkeypatch):
    _Peers(monkeypatch, 2, 0, {})
    with pytest.raises(ValueError, match=re.escape("all-gather: output of 5 elements for 2 ranks x 3")):
        BroadcastAllGather()(torch.empty(5), torch.empty(3), GROUP)
    with pytest.raises(ValueError, match=re.escape("reduce-scatter: input of 7 elements for 2 ranks x 3")):
        AllReduceScatter()(torch.empty(3), torch.empty(7), GROUP, None)


def test_buffers_come_from_the_plain_allocator_with_the_asked_shape_and_dtype():
    for comm in (BroadcastAllGather(), AllReduceScatter()):
        for device in ("cpu", "meta"):  # (meta: a device that is not the default one)
            t = comm.allocate((3, 2), dtype=torch.bfloat16, device=torch.device(device))
            assert (t.shape, t.dtype, t.device.type) == ((3, 2), torch.bfloat16, device)


class _Unit:
    def __init__(self):
        self.gather = self.scatter = None

    def set_custom_all_gather(self, comm):
        self.gather = comm

    def set_custom_reduce_scatter(self, comm):
        self.scatter = comm


def test_install_gives_every_unit_both_or_leaves_them_native():
    units = [_Unit(), _Unit()]
    assert install(units, "broadcast") == 2
    assert all(isinstance(u.gather, BroadcastAllGather) and isinstance(u.scatter, AllReduceScatter) for u in units)
    others = [_Unit()]
    assert install(others, "native") == 0 and others[0].gather is None and others[0].scatter is None
    with pytest.raises(ValueError, match=re.escape(
            "trainer.gloo_collectives must be one of ['broadcast', 'native'], got 'ring'")):
        install(units, "ring")


def _comms(model) -> set[str]:
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    assert len(units) == 3  # 2 decoder layers and the root
    return {type(c).__name__ for u in units for pg in u._get_fsdp_state()._fsdp_param_groups
            for c in (pg._all_gather_comm, pg._reduce_scatter_comm)}


def test_a_one_rank_fsdp2_gloo_group_trains_through_them_unless_native(group, monkeypatch):  # noqa: F811
    from pipeline.train.distributed import strategy
    from pipeline.train.distributed.strategy import TorchParallel

    model = tiny_llama(torch.float32)
    TorchParallel("fsdp2", torch.device("cpu")).wrap(model)  # the default: broadcast
    assert _comms(model) == {"BroadcastAllGather", "AllReduceScatter"}
    model(input_ids=torch.tensor([[1, 2]])).logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    native = tiny_llama(torch.float32)
    TorchParallel("fsdp2", torch.device("cpu"), gloo_collectives="native").wrap(native)
    assert _comms(native) == {"DefaultAllGather", "DefaultReduceScatter"}
    # an NCCL group keeps FSDP2's own (the choice is about gloo only)
    installed = []
    monkeypatch.setattr(strategy, "install_gloo_collectives", lambda units, choice: installed.append(choice))
    TorchParallel("fsdp2", torch.device("cpu")).wrap(tiny_llama(torch.float32))
    assert installed == ["broadcast"]
    on_nccl = TorchParallel("fsdp2", torch.device("cpu"))
    monkeypatch.setattr(strategy.dist, "get_backend", lambda *a: "nccl")
    on_nccl.wrap(tiny_llama(torch.float32))
    assert installed == ["broadcast"]
