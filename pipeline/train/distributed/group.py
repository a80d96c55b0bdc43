"""The trainer's workers as Ray actors: placed, joined into one process group, called together,
watched, and stopped.

`WorkerGroup.start(...)` reserves one bundle per worker in a Ray placement group (`CPU:
num_cpus_per_worker`, plus `GPU: 1` on CUDA; strategy PACK / SPREAD / STRICT_PACK /
STRICT_SPREAD), starts one `TrainerWorker` actor in each, asks rank 0 for its node's address and
a free port, and has every worker join `torch.distributed` there. `call(method, per_rank_args)`
runs a method on every worker at once (each is a collective) and returns their results in rank
order. If a worker's process dies (a crash, kill -9, its node lost), the call ends at once: every
worker is stopped (the survivors would wait in a collective until `collective_timeout_s`) and
`TrainerWorkerError` names the worker, its node, and what to do next. A killed worker's peers often
see the broken connection (gloo: "Connection reset by peer") before Ray sees the exit; such a
transport error waits up to `PEER_DEATH_GRACE_S` for Ray to name a dead peer, and names that one.
A worker that raises (a bad hook, a model it cannot shard) stops the group the same way and
re-raises its error.
Workers get the driver's `sys.path` (so plugins by dotted path import there too) and their
torch thread count through their environment, and workers that release freed memory glibc's
huge-page tunable there (`pipeline.process.malloc.release_env`: glibc reads it at start only).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from typing import Any

from pipeline.cluster import ray_runtime
from pipeline.process import malloc

__all__ = ["PEER_DEATH_GRACE_S", "PLACEMENT_TIMEOUT_S", "TrainerWorkerError", "WorkerGroup", "worker_env"]

logger = logging.getLogger(__name__)

# seconds to wait for the cluster to place every worker before the run is refused (a cluster
# that is short of CPUs or GPUs never places them)
PLACEMENT_TIMEOUT_S = 120.0

# seconds a worker's transport error (a collective whose peer went away) waits for Ray to report
# which peer died; Ray sees a killed process within about a second
PEER_DEATH_GRACE_S = 10.0

# what a collective raises when a peer's process is gone (gloo, NCCL, their sockets)
_PEER_LOST = re.compile(r"connection (reset|closed|refused)|broken pipe|gloo|nccl|socket", re.IGNORECASE)


class TrainerWorkerError(RuntimeError):
    """A trainer worker died or failed; the group is stopped."""


def worker_env(num_threads: int, release_freed_memory: bool = False) -> dict[str, str]:
    """Environment of a worker process: the driver's import path and thread counts, and for a
    worker that releases freed memory glibc's huge-page tunable (`malloc.release_env`)."""
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    return {"PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": str(num_threads),
            "TOKENIZERS_PARALLELISM": "false", **(malloc.release_env(os.environ) if release_freed_memory else {})}


class WorkerGroup:
    """N `TrainerWorker` actors in one placement group (module docstring)."""

    def __init__(self, num_workers: int, resume_hint: str) -> None:
        self.num_workers = int(num_workers)
        self.resume_hint = resume_hint
        self.actors: list[Any] = []
        self.where: list[dict[str, Any]] = []
        self._pg: Any = None
        self._lease: Any = None

    def start(self, *, address: str | None, local_cpus: int, local_gpus: int | None, device: str, backend: str,
              num_cpus_per_worker: float, placement_strategy: str, num_threads: int, timeout_s: float,
              release_freed_memory: bool = False) -> None:
        """Place and start the workers and join them into one process group (`release_freed_memory`:
        each worker returns freed memory to the OS at once, `pipeline.process.malloc.release_freed_memory`)."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from pipeline.train.distributed.worker import TrainerWorker

        self._lease = ray_runtime.acquire(address, local_cpus, None, who="trainer workers", num_gpus=local_gpus)
        gpus = 1.0 if device == "cuda" else 0.0
        bundle = {"CPU": float(num_cpus_per_worker), **({"GPU": gpus} if gpus else {})}
        self._pg = placement_group([dict(bundle) for _ in range(self.num_workers)], strategy=placement_strategy)
        try:
            ray.get(self._pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            have = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
            self.close()
            raise TrainerWorkerError(
                f"trainer: the Ray cluster cannot place {self.num_workers} workers of {bundle} ({placement_strategy}) "
                f"within {PLACEMENT_TIMEOUT_S:.0f} s; it has {have} free. Use fewer trainer.num_workers, a smaller "
                f"trainer.num_cpus_per_worker (e.g. 0.5), another trainer.placement_strategy, or, with engine=ray "
                f"on a local Ray, a larger engine.num_cpus") from None
        cls = ray.remote(TrainerWorker)
        env = {"env_vars": worker_env(num_threads, release_freed_memory)}
        self.actors = [cls.options(num_cpus=bundle["CPU"], num_gpus=gpus, max_restarts=0, runtime_env=env,
                                   scheduling_strategy=PlacementGroupSchedulingStrategy(
                                       self._pg, placement_group_bundle_index=rank)).remote(rank, self.num_workers,
                                                                                            num_threads,
                                                                                            release_freed_memory)
                       for rank in range(self.num_workers)]
        self.where = self.call("where")
        port = self.call_one(0, "free_port")
        self.call("init_group", [(self.where[0]["ip"], port, backend, device, timeout_s)] * self.num_workers)
        nodes = sorted({w["ip"] for w in self.where})
        logger.info("trainer: %d workers (%s, %s) on %d node(s), rendezvous %s:%d: %s", self.num_workers, device,
                    backend, len(nodes), self.where[0]["ip"], port,
                    ", ".join(f"rank {w['rank']} pid {w['pid']} on {w['ip']}" for w in self.where))
        logger.info("trainer workers' malloc: %s", self.where[0]["malloc"])

    def call_one(self, rank: int, method: str, *args: Any) -> Any:
        """`method(*args)` on one worker."""
        return self._wait([getattr(self.actors[rank], method).remote(*args)], method, [rank])[0]

    def call(self, method: str, per_rank: list[tuple[Any, ...]] | None = None) -> list[Any]:
        """`method` on every worker at once, with `per_rank[r]` as worker r's arguments."""
        if not self.actors:
            raise TrainerWorkerError("trainer: the workers are stopped (an earlier failure, or close())")
        per_rank = per_rank or [()] * self.num_workers
        refs = [getattr(actor, method).remote(*args) for actor, args in zip(self.actors, per_rank, strict=True)]
        return self._wait(refs, method, list(range(self.num_workers)))

    def _wait(self, refs: list[Any], method: str, ranks: list[int]) -> list[Any]:
        import ray

        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                rank = ranks[refs.index(ref)]
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    self.close()
                    raise TrainerWorkerError(self._died(rank, method, exc)) from None
                except ray.exceptions.RayTaskError as exc:
                    cause = getattr(exc, "cause", None)  # the worker's own exception
                    dead = self._dead_peer(pending, refs, ranks) if _PEER_LOST.search(str(cause)) else None
                    self.close()
                    if dead is not None:
                        raise TrainerWorkerError(self._died(dead[0], method, dead[1])) from None
                    if not isinstance(cause, Exception):
                        raise TrainerWorkerError(f"trainer worker {rank} failed in {method}: {exc}") from None
                    cause.add_note(f"raised by trainer worker {rank} of {self.num_workers} in {method}; the "
                                   f"workers were stopped")
                    raise cause from None
        return ray.get(refs)

    def _dead_peer(self, pending: list[Any], refs: list[Any], ranks: list[int]) -> tuple[int, BaseException] | None:
        """The first of the `pending` calls that Ray reports dead within `PEER_DEATH_GRACE_S`:
        (its rank, Ray's error), or None if none does."""
        import ray

        deadline = time.monotonic() + PEER_DEATH_GRACE_S
        while pending and (left := deadline - time.monotonic()) > 0:
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    return ranks[refs.index(ref)], exc
                except Exception:  # noqa: BLE001 - a survivor's own transport error
                    pass
        return None

    def _died(self, rank: int, method: str, exc: BaseException) -> str:
        w = self.where[rank] if rank < len(self.where) else {}
        node = f"node {w.get('ip', '?')} ({w.get('host', '?')}), pid {w.get('pid', '?')}"
        return (f"trainer worker {rank} of {self.num_workers} died during {method} ({node}): "
                f"{type(exc).__name__}; the other workers were stopped. The newest checkpoint is complete (a "
                f"save in progress leaves only a temp folder); continue with: {self.resume_hint}")

    def close(self) -> None:
        """Stop every worker, free the placement group, release Ray. Idempotent."""
        if self._lease is None and not self.actors:
            return
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - dead already
                pass
        self.actors = []
        # a local Ray that stops with this lease takes its placement group along; removing it first
        # would wait 60 s on a GCS that a stop signal to the whole process group is ending
        if self._pg is not None and not ray_runtime.shuts_down_with(self._lease):
            from ray.util.placement_group import remove_placement_group

            if not ray_runtime.gcs_reachable():
                logger.info("trainer: the Ray cluster's GCS is gone; the workers' placement group went with it")
            else:
                try:
                    remove_placement_group(self._pg)
                except Exception:  # noqa: BLE001 - the runtime is gone already
                    pass
        self._pg = None
        ray_runtime.release(self._lease)
        self._lease = None
