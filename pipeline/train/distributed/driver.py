"""`trainer.num_workers` > 1: the pipeline's trainer is a driver of N workers on Ray.

The pipeline speaks to it as to the one-process trainer (train, weights_for_engine,
save_lora_adapter, export_hf, save, load, weight_version); the workers do the work
(`pipeline.train.distributed.worker`, one per device, `group.WorkerGroup`).

- `train(rollout_id, train_data)`: the optimizer steps are those one process would make
  (`global_batch_size` samples each); each step's samples are split over the workers by tokens
  (`split.plan_shares`) and each worker gets its share of the train data (plain lists). The
  normalisers are summed over the workers (`pipeline.train.parallel`), so the loss and the
  update are the one-process trainer's on the same data, up to float rounding.
- `weights_for_engine()`: rank 0 gathers the whole policy (LoRA merged) once per weight
  version; it reaches the driver through Ray's object store. An engine that takes object refs
  (engine=ray) gets the reference itself (`weights_ref_for_engine`): its replicas read the one
  object rank 0 put there.
- `save(dir)` / `load(dir)`: each worker writes its shard with torch.distributed.checkpoint into
  a temp folder beside `dir`, renamed into place when all are done, with `trainer_state.json`
  (layout "dcp", counters, every rank's random streams); a folder of another worker count or of
  the one-process trainer loads too (resharded).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from pipeline.process.atomic import atomic_dir, atomic_write_text
from pipeline.process.threads import torch_threads
from pipeline.cluster.devices import (HF_ENGINE, cuda_device_count, gpus_for_trainer, process_tuning_note,
                                      resolve_backend, resolve_device)
from pipeline.config.args import SlimeArgs
from pipeline.engines.assets import resolve_checkpoint
from pipeline.engines.weight_sync import as_tensors
from pipeline.run.overrides import command_arg
from pipeline.train import batches
from pipeline.train.distributed import split
from pipeline.train.distributed.group import WorkerGroup
from pipeline.train.distributed.strategy import STRATEGIES, wrap_classes
from pipeline.train.model import export_state
from pipeline.train.state import FORMAT_VERSION, read_meta

__all__ = ["DistributedTrainer", "SHARDED_LAYOUT"]

logger = logging.getLogger(__name__)

# trainer_state.json's "layout" of a sharded state (the one-process trainer's files have none)
SHARDED_LAYOUT = "dcp"


class DistributedTrainer:
    """N trainer workers behind the one-process trainer's face (module docstring). Keyword
    arguments are conf/trainer/policy_gradient.yaml's keys; with `args` the workers start now."""

    def __init__(self, *, args: Any = None, **keys: Any) -> None:
        self.keys = dict(keys)
        k = self.keys
        if not isinstance(k["num_workers"], int) or k["num_workers"] < 1:
            raise ValueError(f"trainer.num_workers must be an integer >= 1, got {k['num_workers']!r}")
        if k["strategy"] not in STRATEGIES:
            raise ValueError(f"trainer.strategy must be one of {list(STRATEGIES)}, got {k['strategy']!r}")
        self.num_workers = int(k["num_workers"])
        self.weight_version = 0
        self.optimizer_step = 0
        self.group: WorkerGroup | None = None
        self._args: dict[str, Any] | None = None
        self._weights: tuple[int, Any] | None = None  # (version, object ref of rank 0's gathered weights)
        if args is not None:
            self.bind_args(args)

    # -- set-up ---------------------------------------------------------------------------------

    def bind_args(self, args: Any) -> None:
        """Give the workers the run's args (their slime hooks read them) and start them."""
        base = args.as_dict() if hasattr(args, "as_dict") else dict(vars(args))
        self._args = {**base, **self.keys}
        self.start()

    @property
    def args(self) -> Any:
        return SlimeArgs(self._args if self._args is not None else self.keys)

    def _resume_hint(self) -> str:
        base = self._args or {}
        run_dir = base.get("resume") or (base.get("paths") or {}).get("output_dir")
        return f"python run.py {command_arg('resume', os.path.abspath(run_dir))}" if run_dir else \
            "python run.py resume=<run dir>"

    def start(self) -> None:
        """Place the workers, join their process group, build the trainer on each."""
        if self.group is not None:
            return
        k = self.keys
        address = self._address()
        # a local Ray: this machine's GPUs; on a cluster the nodes' GPUs are counted by Ray
        device = resolve_device(k["device"], "trainer.device", gpus=None if address is None else self._cluster_gpus())
        backend = resolve_backend(k["backend"], device)
        if k["strategy"] == "fsdp2":
            self._check_shardable()
        threads = torch_threads(k["num_threads"], self.num_workers, k["num_cpus_per_worker"])
        group = WorkerGroup(self.num_workers, self._resume_hint())
        self.group = group
        try:
            group.start(address=address, local_cpus=self._local_cpus(), local_gpus=self._local_gpus(device, address),
                        device=device,
                        backend=backend, num_cpus_per_worker=float(k["num_cpus_per_worker"]),
                        placement_strategy=k["placement_strategy"], num_threads=threads,
                        timeout_s=float(k["collective_timeout_s"]),
                        release_freed_memory=release_freed_memory(k["release_freed_memory"], k["strategy"], device))
            worker_keys = {**k, "device": device, "num_threads": threads, "hf_checkpoint": self._checkpoint_folder()}
            counts = group.call("build", [(worker_keys, self._args)] * self.num_workers)
        except BaseException:
            self.close()
            raise
        logger.info("trainer: %s over %d workers, trainable parameters per worker %s", k["strategy"],
                    self.num_workers, counts)

    def _checkpoint_folder(self) -> str | None:
        """The local HF folder of hf_checkpoint, made once here (the workers load it, not convert it)."""
        ckpt = self.keys["hf_checkpoint"]
        return None if ckpt is None else resolve_checkpoint(ckpt, self.keys["cache_dir"])

    def _address(self) -> str | None:
        """The Ray cluster the workers join: trainer.address, else engine=ray's (one run, one Ray)."""
        engine = (self._args or {}).get("engine") or {}
        if self.keys["address"] is None and isinstance(engine, dict) \
                and str(engine.get("_target_", "")).endswith("RayEngine"):
            return engine.get("address")  # optional for the ray engine (its own default is None)
        return self.keys["address"]

    def _check_shardable(self) -> None:
        """Refuse a model FSDP2 cannot shard before any worker starts (the model built on the
        meta device: no weights read)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        folder = self._checkpoint_folder()
        if folder is None:
            return
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
        wrap_classes(model, self.keys["fsdp_wrap_modules"])

    def _cluster_gpus(self) -> int:
        import ray

        if not ray.is_initialized():
            return cuda_device_count()
        return int(ray.cluster_resources().get("GPU", 0))

    def _local_gpus(self, device: str, address: str | None) -> int | None:
        """GPUs a local Ray started for the workers declares: None (Ray counts them) on the CPU or
        a cluster; on CUDA this machine's, less the hf engine's own when it keeps one
        (`engine.colocate=false`: the engine takes the last GPU, Ray hands out the first ones)."""
        if device != "cuda" or address is not None:
            return None
        engine = (self._args or {}).get("engine") or {}
        visible = cuda_device_count()
        own = (isinstance(engine, dict) and engine.get("_target_") == HF_ENGINE and engine.get("colocate") is False
               and resolve_device(engine.get("device"), "engine.device", gpus=visible) == "cuda")
        return gpus_for_trainer(visible, own)

    def _local_cpus(self) -> int:
        """CPUs a local Ray started for the workers declares: this machine's, or as many as the
        workers and engine=ray's replicas reserve if that is more (Ray's CPUs are a budget, not
        cores: oversubscribing cores is warned about at pre-flight, not deadlocked here)."""
        need = self.num_workers * float(self.keys["num_cpus_per_worker"])
        engine = (self._args or {}).get("engine") or {}
        if isinstance(engine, dict) and str(engine.get("_target_", "")).endswith("RayEngine"):
            need += float(engine["num_replicas"]) * float(engine["num_cpus_per_replica"])
            if engine.get("num_cpus"):
                need = max(need, float(engine["num_cpus"]))
        return max(os.cpu_count() or 1, int(need + 0.999))

    def close(self) -> None:
        """Stop the workers (and the Ray this trainer started). Idempotent."""
        if self.group is not None:
            self.group.close()
            self.group = None

    def _group(self) -> WorkerGroup:
        if self.group is None:
            self.start()
        assert self.group is not None
        return self.group

    # -- the update -----------------------------------------------------------------------------

    def train(self, rollout_id: int, train_data: dict[str, Any]) -> dict[str, float]:
        """One round of updates over the workers; the one-process trainer's metrics plus
        perf/train_token_imbalance (the largest worker share of tokens over the mean)."""
        start = time.perf_counter()
        group = self._group()
        tokens, lengths = train_data["tokens"], train_data["response_lengths"]
        n = len(tokens)
        if not n:
            logger.warning("rollout %d: no train samples; the trainer skips this rollout", rollout_id)
            return {}
        total = [len(t) for t in tokens]
        steps = batches.optimizer_steps(n, self.keys["global_batch_size"], train_data.get("rollout_ids"))
        # each worker's share keeps its whole step's per-rollout weights (the normalisers are the step's)
        train_data = batches.annotate(train_data, steps)
        shares = split.plan_shares(steps, total, split.prompt_keys(tokens, lengths), self.num_workers)
        per_rank = [(rollout_id, split.slice_train_data(train_data, s.samples, n), s.steps) for s in shares]
        results = group.call("train", per_rank)
        self.weight_version += 1
        self.optimizer_step += len(steps)
        self._weights = None
        elapsed = time.perf_counter() - start
        out = dict(results[0])
        out["perf/train_time"] = elapsed
        out["perf/train_tokens_per_sec"] = sum(total) / elapsed if elapsed > 0 else 0.0
        loads = [s.num_tokens(total) for s in shares]
        out["perf/train_token_imbalance"] = max(loads) / (sum(loads) / len(loads)) if sum(loads) else 1.0
        logger.info("rollout %d: %d optimizer step(s) over %d workers, loss %.4g, weight version %d", rollout_id,
                    len(steps), self.num_workers, out.get("train/loss", float("nan")), self.weight_version)
        return out

    # -- weights and state ----------------------------------------------------------------------

    def weights_ref_for_engine(self) -> Any:
        """An object ref of the whole policy under HF names (gathered once per weight version)."""
        if self._weights is None or self._weights[0] != self.weight_version:
            group = self._group()
            refs = [actor.weights.remote() for actor in group.actors]
            group._wait(refs, "weights", list(range(self.num_workers)))
            self._weights = (self.weight_version, refs[0])
        return self._weights[1]

    def weights_for_engine(self) -> dict[str, Any]:
        """The whole policy under HF names, LoRA merged (rank 0's gather, through the object store)."""
        import ray

        return as_tensors(ray.get(self.weights_ref_for_engine()))

    def save_lora_adapter(self, directory: str) -> str:
        """The LoRA adapter as a peft folder (rank 0's tensors, written here), atomically."""
        from peft import PeftConfig
        from safetensors.torch import save_file

        if not int(self.keys["lora_rank"]) > 0:
            raise ValueError("save_lora_adapter needs a LoRA trainer (trainer.lora_rank > 0)")
        tensors, config = self._group().call("adapter")[0]
        with atomic_dir(directory) as tmp:
            save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
            # the worker sends the config as a dict (shards.adapter_weights): peft's object writes it
            PeftConfig.from_peft_type(**config).save_pretrained(str(tmp))
        return str(directory)

    def export_hf(self, directory: str) -> str:
        """The policy (LoRA merged) as a plain HF folder with the checkpoint's tokenizer."""
        from transformers import AutoConfig

        folder = self._checkpoint_folder()
        return export_state(AutoConfig.from_pretrained(folder), self.weights_for_engine(), folder, directory)

    def save(self, directory: str) -> None:
        """Every worker's shard, the counters and every rank's random streams, as one folder (atomically)."""
        group = self._group()
        with atomic_dir(directory) as tmp:
            rngs = group.call("save", [(str(tmp),)] * self.num_workers)
            meta = {"format_version": FORMAT_VERSION, "layout": SHARDED_LAYOUT, "num_workers": self.num_workers,
                    "strategy": self.keys["strategy"], "weight_version": self.weight_version,
                    "optimizer_step": self.optimizer_step, "rng": rngs}
            atomic_write_text(tmp / "trainer_state.json", json.dumps(meta))

    def load(self, directory: str) -> None:
        """Restore a state `save` wrote with any number of workers, or the one-process trainer's."""
        folder = Path(directory)
        meta = read_meta(folder)
        rngs = meta.get("rng") if meta.get("layout") == SHARDED_LAYOUT else []
        counters = {"weight_version": int(meta["weight_version"]), "optimizer_step": int(meta["optimizer_step"])}
        per_rank = [(str(folder), rngs[r] if r < len(rngs) else None, counters) for r in range(self.num_workers)]
        self._group().call("load", per_rank)
        saved = meta.get("num_workers", 1)
        self.weight_version, self.optimizer_step = counters["weight_version"], counters["optimizer_step"]
        by = f"{meta.get('strategy', 'a trainer')} over {saved} workers" if meta.get("layout") == SHARDED_LAYOUT \
            else "one process"
        now = f"{self.keys['strategy']} over {self.num_workers} workers"
        logger.info("trainer state loaded from %s (weight version %d), saved by %s, now %s%s", folder,
                    self.weight_version, by, now, " (resharded)" if saved != self.num_workers else "")
        self._weights = None


def release_freed_memory(value: Any, strategy: str, device: str) -> bool:
    """`trainer.release_freed_memory` resolved: auto is on for fsdp2 on CPU (sharding is for
    memory), off for ddp (a full replica per worker: keeping freed memory for reuse saves page
    faults) and on CUDA (a CPU-heap tuning: the sharded state lives on the GPU; one log line)."""
    if value != "auto":
        return bool(value)
    if device == "cuda" and strategy == "fsdp2":
        logger.info(process_tuning_note("trainer.release_freed_memory", "the workers train on CUDA"))
    return strategy == "fsdp2" and device == "cpu"
