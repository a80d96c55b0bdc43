"""`ray`: N replicas of the hf engine as Ray actors, least-loaded dispatch, failover.

Each replica is an async Ray actor holding an `HFEngine` (continuous batching inside it).
Requests go to the live replica with the fewest requests in flight. When a replica dies (crash,
`ray.kill`, node loss) its in-flight requests are resubmitted to the others and a replacement
actor is started in its slot. Requests and results cross to Ray as plain dicts (no pickled
project objects on the wire beyond Ray's own transport).

Abort uses epochs, so no request escapes it whatever stage it is in: `abort_all` bumps the
driver's epoch and fans the new epoch out to every live replica; each request is stamped with
the epoch current when `generate` was called. A replica remembers the newest epoch it has seen
(from an abort or from a newer request) and answers a request stamped with an older one at once
with finish "abort" (a request still in transit when the abort landed), while `HFEngine.abort_all`
finishes the rows it is running with their partial output. Requests still queued on the driver
(waiting for a ready replica, or for a resubmission) see the bumped epoch and return "abort".
Replica actors get `OMP_WAIT_POLICY=PASSIVE` through their runtime env (the driver's own value
wins), and the driver's `GOMP_SPINCOUNT` when it has one (`omp_spin_count`, `pipeline/process/openmp.py`;
libgomp puts it before the policy).

Weight sync: `update_weights` puts the state dict in Ray's object store once (`ray.put`) and
every replica fetches that one object (`HFEngine.update_weights` in place, see `pipeline.engines.
hf`); the driver keeps the reference, so a replica (re)started later is constructed with it and
comes back serving the current version. Replicas still loading get the update queued behind
their constructor.

Devices (`device`): resolved once Ray is up, against the cluster's GPUs (`auto`: CUDA when Ray
has any). On CUDA each replica actor asks Ray for one GPU (`num_gpus=1`, `replica_options`) and
builds its HFEngine with device cuda: Ray shows the actor its one GPU, so it decodes on `cuda:0`.
On the CPU the actors and their engines are what they always were.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from typing import Any

from pipeline.cluster import ray_runtime
from pipeline.cluster.devices import DEVICES, DeviceError, resolve_device
from pipeline.engines.assets import load_tokenizer, resolve_checkpoint
from pipeline.engines.base import GenerationRequest, GenerationResult, SamplingParams
from pipeline.rollout.async_loop import run_sync

__all__ = ["RayEngine", "request_to_dict", "request_from_dict", "replica_env", "replica_options"]

logger = logging.getLogger(__name__)

# environment variables every replica actor gets (unless the driver's environment sets them):
# OpenMP threads sleep instead of spinning between torch ops, which on shared cores otherwise
# steal the CPU from the other replicas (pipeline/process/openmp.py)
_REPLICA_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
# passed on only when the driver has it: the spin-wait `omp_spin_count` set for this run
_REPLICA_ENV_FROM_DRIVER = ("GOMP_SPINCOUNT",)


def replica_env() -> dict[str, str]:
    """`runtime_env.env_vars` for the replica actors: `_REPLICA_ENV`, driver values winning, and
    the driver's `_REPLICA_ENV_FROM_DRIVER` variables it has."""
    env = {key: os.environ.get(key, value) for key, value in _REPLICA_ENV.items()}
    return env | {key: os.environ[key] for key in _REPLICA_ENV_FROM_DRIVER if key in os.environ}


def replica_options(num_cpus: float, resources: dict[str, float], device: str) -> dict[str, Any]:
    """The Ray actor options of a replica: its CPUs, its custom resources, and on CUDA
    (`device` "cuda") one GPU of its own."""
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 0, "max_concurrency": 1000}
    if resources:
        options["resources"] = resources
    if device == "cuda":
        options["num_gpus"] = 1
    return options


def request_to_dict(request: GenerationRequest) -> dict[str, Any]:
    """A GenerationRequest as plain JSON-able data."""
    d = dataclasses.asdict(request)
    d["sampling"]["stop"] = list(request.sampling.stop)
    d["sampling"]["stop_token_ids"] = list(request.sampling.stop_token_ids)
    return d


def request_from_dict(d: dict[str, Any]) -> GenerationRequest:
    """Inverse of `request_to_dict`."""
    s = dict(d["sampling"])
    s["stop"] = tuple(s["stop"])
    s["stop_token_ids"] = tuple(s["stop_token_ids"])
    return GenerationRequest(request_id=d["request_id"], input_ids=d["input_ids"], text=d["text"],
                             sampling=SamplingParams(**s), session_id=d["session_id"])


class _Replica:
    """Ray actor body: one HFEngine (becomes a remote class in `RayEngine.start`)."""

    def __init__(self, engine_kwargs: dict[str, Any], epoch: int = 0, weights: Any = None,
                 version: int = 0) -> None:
        from pipeline.engines.hf import HFEngine

        self.engine = HFEngine(**engine_kwargs)
        self.engine.start()
        if weights is not None:  # a restart after updates: serve the current version at once
            self.engine.update_weights(weights, version)
        # newest driver abort epoch seen; requests stamped older are answered "abort"
        self.epoch = epoch

    async def generate(self, request: dict[str, Any], epoch: int = 0) -> dict[str, Any]:
        # no await between the epoch check and the row joining the engine (HFEngine.generate
        # stamps the row synchronously once started), so an abort cannot slip in between
        if epoch < self.epoch:
            return dataclasses.asdict(GenerationResult(request["request_id"], [], "", "abort", []))
        if epoch > self.epoch:  # the driver aborted and this replica has not heard of it yet
            await self.abort_all(epoch)
        return dataclasses.asdict(await self.engine.generate(request_from_dict(request)))

    async def abort_all(self, epoch: int | None = None) -> None:
        self.epoch = self.epoch + 1 if epoch is None else max(self.epoch, epoch)
        await self.engine.abort_all()

    async def health(self) -> bool:
        return await self.engine.health()

    async def update_weights(self, weights: Any, version: int) -> int:
        # Ray resolved the driver's object ref to the state dict (one fetch per replica)
        if version > self.engine.weight_version:
            # numpy arrays (a distributed trainer's gather, `as_arrays`) become tensors here
            from pipeline.engines.weight_sync import as_tensors

            await asyncio.to_thread(self.engine.update_weights, as_tensors(weights), version)
        return self.engine.weight_version

    async def weight_version(self) -> int:
        return self.engine.weight_version

    async def stats(self) -> dict[str, float]:
        return {"tokens_generated": self.engine.tokens_generated, "busy_s": self.engine.busy_s}


@dataclasses.dataclass
class _Slot:
    actor: Any = None
    # the actor answered a health call (its model is loaded)
    ready: bool = False
    inflight: int = 0
    restarts: int = 0


class RayEngine:
    """A pool of hf-engine Ray actors (see module docstring)."""

    # follows a trainer through update_weights (full state dicts, one object-store put)
    weight_sync = "full"
    # update_weights takes a Ray object ref of the state too (a distributed trainer's gather)
    takes_object_refs = True

    def __init__(
        self,
        hf_checkpoint: str,
        cache_dir: str | None = None,
        num_replicas: int = 2,
        address: str | None = None,
        num_cpus: int | None = None,
        num_cpus_per_replica: float = 1.0,
        threads_per_replica: int = 1,
        resources_per_replica: dict[str, float] | None = None,
        max_batch_size: int = 32,
        max_restarts: int = 3,
        max_attempts: int = 4,
        seed: int = 0,
        temp_dir: str | None = None,
        device: str = "cpu",
        # the SGLang-compatible endpoint in front of this engine (pipeline/serving; read by the run, not here)
        serve_http: bool | str = "auto",
    ) -> None:
        self.serve_http = serve_http
        if num_replicas < 1:
            raise ValueError(f"engine.num_replicas must be >= 1, got {num_replicas}")
        if device not in DEVICES:
            raise ValueError(f"engine.device={device!r}: expected one of {list(DEVICES)}")
        self.hf_checkpoint = hf_checkpoint
        self.cache_dir = cache_dir
        self.num_replicas = num_replicas
        self.address = address
        self.num_cpus = num_cpus
        self.num_cpus_per_replica = num_cpus_per_replica
        self.threads_per_replica = threads_per_replica
        self.resources_per_replica = dict(resources_per_replica or {})
        self.max_batch_size = max_batch_size
        self.max_restarts = max_restarts
        self.max_attempts = max_attempts
        self.seed = seed
        self.temp_dir = temp_dir
        self.device = device
        # "cpu" or "cuda", resolved against the Ray cluster's GPUs in start()
        self._device: str | None = None
        self._slots: list[_Slot] = []
        self._actor_cls: Any = None
        self._ray_lease: Any = None
        self._abort_epoch = 0
        self._started = False
        self._start_lock: tuple[Any, asyncio.Lock] | None = None
        self._closed = False
        self._tokenizer: Any = None
        # the current weights in the object store (None: the checkpoint's) and their version
        self._weights_ref: Any = None
        self._weight_version = 0

    @property
    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer in the driver (loaded on first use)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(resolve_checkpoint(self.hf_checkpoint, self.cache_dir))
        return self._tokenizer

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start Ray (or connect to `address`) and the replicas; waits until all are ready."""
        loop = asyncio.get_running_loop()
        if self._start_lock is None or self._start_lock[0] is not loop:
            self._start_lock = (loop, asyncio.Lock())
        async with self._start_lock[1]:
            if self._started:
                return
            if self._closed:
                raise RuntimeError("RayEngine is closed")
            import ray

            path = await asyncio.to_thread(resolve_checkpoint, self.hf_checkpoint, self.cache_dir)
            self._engine_kwargs = {"hf_checkpoint": path, "num_threads": self.threads_per_replica,
                                   "max_batch_size": self.max_batch_size}
            # the run's one Ray runtime, shared with the trainer's workers (pipeline.cluster.ray_runtime)
            self._ray_lease = ray_runtime.acquire(self.address, self.num_cpus, self.temp_dir, who="engine=ray")
            # Ray's count of the cluster's GPUs, not this machine's: replicas may run elsewhere
            gpus = int(ray.cluster_resources().get("GPU", 0))
            if self.device == "cuda" and gpus == 0:
                ray_runtime.release(self._ray_lease)
                self._ray_lease = None
                raise DeviceError(f"engine.device=cuda, but the Ray cluster ({self.address or 'a local Ray'}) has no "
                                  f"GPU for the replicas; use engine.device=cpu or engine.device=auto")
            self._device = resolve_device(self.device, "engine.device", gpus)
            self._engine_kwargs["device"] = self._device
            self._actor_cls = ray.remote(runtime_env={"env_vars": replica_env()})(_Replica)
            self._slots = [_Slot() for _ in range(self.num_replicas)]
            for i in range(self.num_replicas):
                self._spawn(i)
            await asyncio.gather(*(self._await_ready(i) for i in range(self.num_replicas)))
            self._started = True

    def _spawn(self, i: int) -> None:
        slot = self._slots[i]
        replica_seed = self.seed * 1000 + i + 100 * slot.restarts
        assert self._device is not None
        options = replica_options(self.num_cpus_per_replica, self.resources_per_replica, self._device)
        slot.actor = self._actor_cls.options(**options).remote(
            {**self._engine_kwargs, "seed": replica_seed}, self._abort_epoch, self._weights_ref,
            self._weight_version)
        slot.ready = False
        slot.inflight = 0

    async def _await_ready(self, i: int) -> None:
        slot = self._slots[i]
        actor = slot.actor
        await actor.health.remote()
        if slot.actor is actor:
            slot.ready = True

    def close(self) -> None:
        """Kill the replicas (and stop Ray if this engine started it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            import ray
        except ImportError:  # pragma: no cover
            return
        for slot in self._slots:
            if slot.actor is not None:
                try:
                    ray.kill(slot.actor)
                except Exception:  # noqa: BLE001 - already dead
                    pass
        self._slots = []
        ray_runtime.release(self._ray_lease)
        self._ray_lease = None

    def replicas(self) -> list[Any]:
        """The current actor handles (tests kill them to exercise failover)."""
        return [slot.actor for slot in self._slots]

    # -- Engine API ---------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Dispatch to the least-loaded ready replica; resubmit when a replica dies."""
        import ray

        if not self._started:
            await self.start()
        epoch = self._abort_epoch
        payload = request_to_dict(request)
        last_error: BaseException | None = None
        for _attempt in range(self.max_attempts):
            if self._abort_epoch != epoch:
                return GenerationResult(request.request_id, [], "", "abort", [])
            i = await self._pick()
            if self._abort_epoch != epoch:  # aborted while waiting for a ready replica
                return GenerationResult(request.request_id, [], "", "abort", [])
            slot = self._slots[i]
            actor = slot.actor
            slot.inflight += 1
            try:
                out = await actor.generate.remote(payload, epoch)
            except ray.exceptions.RayActorError as exc:
                last_error = exc
                logger.warning("ray replica %d died (%s); resubmitting %s", i,
                               type(exc).__name__, request.request_id)
                self._replace(i, actor)
                continue
            finally:
                if slot.actor is actor:
                    slot.inflight -= 1
            return GenerationResult(**out)
        raise RuntimeError(f"request {request.request_id}: every attempt failed") from last_error

    async def _pick(self) -> int:
        while True:
            ready = [i for i, s in enumerate(self._slots) if s.ready]
            if ready:
                return min(ready, key=lambda i: self._slots[i].inflight)
            if not any(s.actor is not None for s in self._slots):
                raise RuntimeError("ray engine has no replicas left (restart budget exhausted)")
            await asyncio.sleep(0.05)  # every replica is (re)starting

    def _replace(self, i: int, dead: Any) -> None:
        """Start a replacement in slot i unless someone already did (or the budget is spent)."""
        slot = self._slots[i] if i < len(self._slots) else None
        if slot is None or slot.actor is not dead or self._closed:
            return
        if slot.restarts >= self.max_restarts:
            logger.error("ray replica %d exceeded %d restarts; leaving it down", i, self.max_restarts)
            slot.actor, slot.ready = None, False
            return
        slot.restarts += 1
        self._spawn(i)
        asyncio.get_running_loop().create_task(self._await_ready_logged(i))

    async def _await_ready_logged(self, i: int) -> None:
        try:
            await self._await_ready(i)
            logger.info("ray replica %d restarted", i)
        except Exception as exc:  # noqa: BLE001 - a failed restart is retried by the next failure
            logger.error("ray replica %d failed to restart: %r", i, exc)
            self._replace(i, self._slots[i].actor)

    async def abort_all(self) -> None:
        """Abort every request submitted so far, wherever it is (see module docstring)."""
        self._abort_epoch += 1
        epoch = self._abort_epoch
        # ready replicas only: a (re)starting one is constructed with the current epoch, or hears
        # of it from the next request it gets
        calls = [s.actor.abort_all.remote(epoch) for s in self._slots if s.actor is not None and s.ready]
        results = await asyncio.gather(*calls, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                logger.warning("abort on a replica failed: %r", r)

    async def health(self) -> bool:
        """True when at least one replica is ready."""
        return not self._closed and any(s.ready for s in self._slots)

    @property
    def weight_version(self) -> int:
        """The version every replica serves once `update_weights` returned (0: the checkpoint's)."""
        return self._weight_version

    def update_weights(self, state: Any, version: int) -> None:
        """Put `state` in the object store once (or take it as it is when it is an object ref
        already: a distributed trainer's gathered weights); every replica copies it in place. Blocks until
        all live replicas serve `version` (a replica that dies meanwhile restarts with it); a
        state the model rejects (unknown name, wrong shape) changes nothing and raises. Call it
        from outside the rollout's event loop (it waits with `ray.get`)."""
        import ray

        if not isinstance(version, int) or isinstance(version, bool) or version <= self._weight_version:
            raise ValueError(f"update_weights: version must be an int > the current version "
                             f"{self._weight_version}, got {version!r}")
        if not self._started:
            run_sync(self.start())
        ref = state if isinstance(state, ray.ObjectRef) else ray.put(dict(state))
        before = (self._weights_ref, self._weight_version)
        # first: a replica spawned from now on starts from these weights
        self._weights_ref, self._weight_version = ref, version
        calls = [(i, s.actor.update_weights.remote(ref, version)) for i, s in enumerate(self._slots)
                 if s.actor is not None]
        rejected: BaseException | None = None
        for i, call in calls:
            try:
                ray.get(call)
            except ray.exceptions.RayActorError as exc:
                # its replacement (started by the next request that finds it dead) loads `ref`
                logger.warning("ray replica %d died during the weight update (%s)", i, type(exc).__name__)
            except ray.exceptions.RayTaskError as exc:  # bad names / shapes: no replica copied them
                rejected = exc.as_instanceof_cause()
        if rejected is not None:
            self._weights_ref, self._weight_version = before
            raise rejected
        logger.info("ray engine: %d replicas updated to weight version %d", len(calls), version)

    async def stats(self) -> list[dict[str, float]]:
        """Per-replica counters (tokens generated, busy seconds)."""
        return list(await asyncio.gather(*(s.actor.stats.remote() for s in self._slots
                                            if s.actor is not None)))
