"""One trainer worker: the body of a Ray actor holding one rank of the trainer's process group.

The driver (`pipeline.train.distributed.driver`) makes one per device and calls, in order:
`where()` (node, address, pid), `free_port()` on rank 0, `init_group(...)` on all (torch.distributed
over TCP at rank 0's address: gloo on CPU, NCCL on CUDA), `build(keys, args)` (the same
`PolicyGradientTrainer` as in one process, on a `TorchParallel`), then per rollout `train(...)`
on its share, and `weights()` / `adapter()` / `save(...)` / `load(...)`, every one of them on
all workers at once (each is a collective).

Random streams: every rank seeds `seed` before the model is built (the same LoRA
initialisation on every rank, and rank 0's stream is the one-process trainer's); ranks > 0
then reseed with `seed + rank`. `save` returns this rank's streams, `load` restores them.
"""

from __future__ import annotations

import datetime
import logging
import os
import resource
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeline.process import malloc
from pipeline.config.args import SlimeArgs
from pipeline.engines.weight_sync import as_arrays
from pipeline.train.distributed import shards
from pipeline.train.distributed.strategy import TorchParallel
from pipeline.train.model import is_lora
from pipeline.train.policy_gradient import PolicyGradientTrainer
from pipeline.train.state import read_state, restore_rng, rng_state, seed_rngs

__all__ = ["TrainerWorker"]

logger = logging.getLogger(__name__)


class TrainerWorker:
    """Ray actor body of one rank (module docstring)."""

    def __init__(self, rank: int, world_size: int, num_threads: int, release_freed_memory: bool = False) -> None:
        self.rank = int(rank)
        self.world_size = int(world_size)
        # before the model loads: its tensors and every step's are allocated under the policy
        self.malloc = malloc.release_freed_memory() if release_freed_memory else "glibc's default malloc"
        torch.set_num_threads(int(num_threads))
        self.trainer: PolicyGradientTrainer | None = None
        self.seed = 0

    # -- the group ------------------------------------------------------------------------------

    def where(self) -> dict[str, Any]:
        """Where this rank runs: node id and IP, host name, process id, GPUs Ray gave it."""
        import ray

        ctx = ray.get_runtime_context()
        return {"rank": self.rank, "node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "host": socket.gethostname(), "pid": os.getpid(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "malloc": self.malloc}

    def free_port(self) -> int:
        """A TCP port free on this node now (rank 0's: the process group's rendezvous)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def init_group(self, address: str, port: int, backend: str, device: str, timeout_s: float) -> None:
        """Join the process group at rank 0's `address:port`."""
        if device == "cuda":
            torch.cuda.set_device(0)  # Ray's CUDA_VISIBLE_DEVICES shows this worker its one GPU
        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=self.rank,
                                world_size=self.world_size, timeout=datetime.timedelta(seconds=float(timeout_s)))

    def build(self, keys: dict[str, Any], args: dict[str, Any] | None) -> int:
        """The trainer of this rank, model loaded and sharded (errors surface here, before any
        rollout); returns its number of trainable parameters on this rank."""
        strategy, wrap = keys["strategy"], keys["fsdp_wrap_modules"]
        device = torch.device("cuda", 0) if keys["device"] == "cuda" else torch.device("cpu")
        self.seed = int(keys["seed"])
        parallel = TorchParallel(strategy, device, list(wrap) if wrap else None, keys["fsdp_reshard_after_forward"],
                                 keys["param_dtype"], keys["gloo_collectives"])
        trainer = PolicyGradientTrainer(parallel=parallel, args=None if args is None else SlimeArgs(args), **keys)
        _ = trainer.optimizer  # the model loads, is sharded, and AdamW is built now
        if self.rank:
            seed_rngs(self.seed + self.rank)
        self.trainer = trainer
        return sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                   for p in trainer.model.parameters() if p.requires_grad)

    def peak_rss_mb(self) -> float:
        """This worker process's peak resident memory so far (MB)."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- work -----------------------------------------------------------------------------------

    def _trainer(self) -> PolicyGradientTrainer:
        if self.trainer is None:
            raise RuntimeError("trainer worker: build() first")
        return self.trainer

    def train(self, rollout_id: int, train_data: dict[str, Any], steps: list[list[int]]) -> dict[str, float]:
        """Train on this rank's share (`steps`: its positions of each optimizer step)."""
        return self._trainer().train(rollout_id, train_data, steps=steps)

    def weights(self) -> dict[str, Any] | None:
        """The whole policy under HF names (LoRA merged) on rank 0, as numpy arrays for the
        object store (`as_arrays`); None elsewhere."""
        model = self._trainer().model
        state = shards.full_weights(model, is_lora(model))
        return None if state is None else as_arrays(state)

    def adapter(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        """The LoRA adapter (tensors, config) on rank 0, None elsewhere."""
        return shards.adapter_weights(self._trainer().model)

    def counters(self) -> dict[str, int]:
        t = self._trainer()
        return {"weight_version": t.weight_version, "optimizer_step": t.optimizer_step}

    def save(self, folder: str) -> dict[str, Any]:
        """Write this rank's shard into `folder`; returns its random streams."""
        t = self._trainer()
        shards.save_shards(t.model, t.optimizer, folder)
        return rng_state()

    def load(self, folder: str, rng: dict[str, Any] | None, counters: dict[str, int]) -> None:
        """Read the state in `folder` (a sharded checkpoint of any number of workers, or a
        one-process trainer's files), then this rank's random streams (`rng`; None: a rank the
        checkpoint did not have, which starts `seed + rank`)."""
        t = self._trainer()
        if shards.is_sharded_state(folder):
            shards.load_shards(t.model, t.optimizer, folder)
        else:
            saved = read_state(folder)
            shards.load_full_state(t.model, t.optimizer, saved)
            rng = saved["rng"] if self.rank == 0 else rng
        if rng is None:
            seed_rngs(self.seed + self.rank)
        else:
            restore_rng(rng)
        t.weight_version = int(counters["weight_version"])
        t.optimizer_step = int(counters["optimizer_step"])
        if self.rank == 0:
            logger.info("trainer state loaded from %s (weight version %d)", Path(folder), t.weight_version)
