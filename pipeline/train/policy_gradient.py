"""`trainer=policy_gradient`: an in-process policy-gradient trainer (slime's loss, slime's key names).

`train(rollout_id, train_data)` runs one round of updates on the rollout's train data:
1. old log-probs: recomputed by the trainer with the current weights before any update (default),
   or the rollout engine's (`use_rollout_logprobs`); reference log-probs when `use_kl_loss`. The
   samples of the first optimizer step skip the extra forward: their weights have not changed
   yet, so their old log-probs are the training forward's own log-probs, detached (the same
   value; with one step per rollout this saves a third of the trainer's compute);
2. advantages: each sample's post-processed reward on every response token (slime's GRPO-family
   returns), or a custom `fn(args, rollout_data) -> None` setting rollout_data["advantages"];
3. per optimizer step (`global_batch_size` rollouts, batches.py; all when null): accumulation over
   micro-batches (`micro_batch_size` samples, or `max_tokens_per_gpu` padded tokens with
   `use_dynamic_batch_size`), loss `pipeline.train.objective.policy_loss` (or slime's custom
   `fn(args, batch, logits, sum_of_sample_mean)` with `loss_type: custom_loss`), gradient
   clipping at `clip_grad`, AdamW with the warm-up/decay schedule;
4. `weight_version` goes up by one; metrics train/* and perf/* come back.
`weights_for_engine()` gives the policy under full HF names (LoRA merged); `save(dir)` / `load(dir)`
write and read the whole state (`pipeline.train.state`). What `prepare` fixes and the micro-batches
cut from it: `pipeline.train.prepared`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import torch

from pipeline.cluster.devices import resolve_device
from pipeline.config.args import SlimeArgs
from pipeline.engines.assets import resolve_checkpoint
from pipeline.config.plugins import allowed_targets, load_object
from pipeline.process.precision import resolve_bf16
from pipeline.process.threads import torch_threads
from pipeline.train import batches, model as policy_model, prepared as prep
from pipeline.train.distributed import shards
from pipeline.train.distributed.shards import load_sharded
from pipeline.train.losses import KL_LOSS_TYPES, LOSS_AGG_MODES, sample_mean_reducer
from pipeline.train.objective import LossHooks, MicroBatch, policy_loss
from pipeline.train.prepared import Prepared
from pipeline.train.optim import LrSchedule, make_adamw
from pipeline.train.parallel import LocalParallel, Parallel
from pipeline.train.shared_prompt import response_passes, shared_prompt_log_probs
from pipeline.train.state import load_state, save_state, seed_rngs

__all__ = ["PolicyGradientTrainer", "HOOK_KEYS"]

logger = logging.getLogger(__name__)

# slime's trainer-side hook keys (dotted paths, loaded with the run's allowlist in `bind_args`)
HOOK_KEYS = ("custom_loss_function_path", "custom_advantage_function_path", "custom_tis_function_path",
             "custom_pg_loss_reducer_function_path")


class PolicyGradientTrainer:
    """The in-process trainer (module docstring). Keyword arguments are the YAML keys
    (conf/trainer/policy_gradient.yaml, which documents each); `model` injects a loaded model;
    `parallel` is the process group it trains in (one of N workers; default: this process alone)."""

    def __init__(self, *, args: Any = None, model: Any = None, parallel: Parallel | None = None,
                 **keys: Any) -> None:
        self.keys = dict(keys)
        k = self.keys
        if parallel is None and k["num_workers"] != 1:
            raise ValueError(f"trainer.num_workers={k['num_workers']!r}: this class trains in one process; N workers "
                             f"are built by _target_: pipeline.train.build.policy_gradient_trainer (the default of "
                             f"trainer=policy_gradient)")
        if parallel is None and k["param_dtype"] != "float32":
            raise ValueError(f"trainer.param_dtype={k['param_dtype']}: FSDP2's mixed precision needs trainer.num_workers "
                             f"> 1 and trainer.strategy=fsdp2; in one process use trainer.bf16=true (autocast)")
        self.parallel = parallel or LocalParallel()
        # "auto": CUDA when this process sees a GPU (a worker sees the one Ray gave it)
        self.device = torch.device(resolve_device(k["device"], "trainer.device"))
        # "auto": bf16 autocast only where this CPU has fast bfloat16 kernels (pipeline.process.precision)
        k["bf16"] = resolve_bf16(k["bf16"])
        # "auto": this process's CPUs, or a worker's Ray reservation (pipeline.process.threads)
        k["num_threads"] = torch_threads(k["num_threads"], k["num_workers"], k["num_cpus_per_worker"])
        if k["kl_loss_type"] not in KL_LOSS_TYPES:
            raise ValueError(f"trainer.kl_loss_type must be one of {list(KL_LOSS_TYPES)}, got {k['kl_loss_type']!r}")
        if k["loss_agg_mode"] not in LOSS_AGG_MODES:
            raise ValueError(f"trainer.loss_agg_mode must be one of {list(LOSS_AGG_MODES)}, got {k['loss_agg_mode']!r}")
        if k["loss_type"] not in ("policy_loss", "custom_loss"):
            raise ValueError(f"trainer.loss_type must be policy_loss or custom_loss, got {k['loss_type']!r}")
        self._schedule = LrSchedule(k["lr"], k["min_lr"], k["lr_warmup_iters"], k["lr_decay_iters"],
                                    k["lr_decay_style"])
        self._model = model
        self._model_ready = False
        self._reference: Any = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._args: Any = None
        self._hooks: dict[str, Callable[..., Any] | None] = {key: None for key in HOOK_KEYS}
        self.weight_version = 0
        self.optimizer_step = 0
        seed_rngs(int(k["seed"]))  # the streams `save` records and `load` restores
        if args is not None:
            self.bind_args(args)

    # -- set-up ---------------------------------------------------------------------------------

    def bind_args(self, args: Any) -> None:
        """Give slime hooks the run's args (with this trainer's keys on top) and load the hook
        paths through the run's allowlist."""
        base = args.as_dict() if hasattr(args, "as_dict") else dict(vars(args))
        self._args = SlimeArgs({**base, **self.keys})
        allowed = allowed_targets(base)
        for key in HOOK_KEYS:
            path = self.keys.get(key)
            self._hooks[key] = load_object(path, allowed, f"trainer.{key}") if path else None
        if self.keys["loss_type"] == "custom_loss" and self._hooks["custom_loss_function_path"] is None:
            raise ValueError("trainer.loss_type=custom_loss needs trainer.custom_loss_function_path")

    @property
    def args(self) -> Any:
        """What slime hooks get: the run's args with this trainer's keys on top."""
        if self._args is None:
            self._args = SlimeArgs(self.keys)
        return self._args

    @property
    def model(self) -> Any:
        """The policy (loaded on first use): on the trainer's device, LoRA-wrapped when
        lora_rank > 0, sharded or replicated by the process group's strategy. With the KL loss
        and full fine-tuning a frozen copy of it is taken first (the reference)."""
        if not self._model_ready:
            k = self.keys
            model = self._model
            if model is None:
                model = policy_model.load_policy(k["hf_checkpoint"], k["cache_dir"], k["lora_rank"], k["lora_alpha"],
                                                 k["lora_dropout"], k["lora_target_modules"],
                                                 k["attn_implementation"])
            elif k["lora_rank"] > 0 and not policy_model.is_lora(model):
                model = policy_model.wrap_lora(model, k["lora_rank"], k["lora_alpha"], k["lora_dropout"],
                                               k["lora_target_modules"])
            model = model.to(self.device)
            if k["use_kl_loss"] and not policy_model.is_lora(model):
                # the initial policy, before any update or state load
                self._reference = self.parallel.wrap(policy_model.frozen_copy(model))
            self._model = self.parallel.wrap(model)
            self._model_ready = True
        return self._model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            k = self.keys
            self._optimizer = make_adamw(self.model.parameters(), k["lr"], k["weight_decay"], k["adam_beta1"],
                                         k["adam_beta2"], k["adam_eps"])
        return self._optimizer

    def _autocast(self) -> torch.dtype | None:
        return torch.bfloat16 if self.keys["bf16"] else None

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    # -- the update -----------------------------------------------------------------------------

    def train(self, rollout_id: int, train_data: dict[str, Any],
              steps: list[list[int]] | None = None) -> dict[str, float]:
        """One round of updates on `train_data`; returns train/* and perf/* metrics. `steps`: the
        sample indices of each optimizer step (default: `global_batch_size` consecutive samples
        each); a worker of N gets its share of every step, possibly none of one."""
        start = time.perf_counter()
        torch.set_num_threads(int(self.keys["num_threads"]))
        samples = batches.TrainSamples.from_train_data(train_data).to(self.device)
        if steps is None:  # (a worker's steps come with train data annotated for them: batches.annotate)
            if not len(samples):
                logger.warning("rollout %d: no train samples; the trainer skips this rollout", rollout_id)
                return {}
            samples, steps = samples.planned(self.keys["global_batch_size"])
        sums: dict[str, float] = {}
        prepared = self.prepare(samples, first_step=steps[0])  # (steps has one step at least)
        for indices in steps:
            lr = self._schedule.apply(self.optimizer, self.optimizer_step)
            self.optimizer.zero_grad(set_to_none=True)
            metrics = self.accumulate(prepared, indices, backward=True)
            grad_norm = self.parallel.clip_grad_norm(self._trainable(), float(self.keys["clip_grad"]))
            self.optimizer.step()
            self.optimizer_step += 1
            metrics["grad_norm"] = grad_norm
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
        sums = self.parallel.combine(sums)
        self.weight_version += 1
        elapsed = time.perf_counter() - start
        out = {f"train/{key}": value / max(len(steps), 1) for key, value in sums.items()}
        out["train/lr"] = lr
        out["perf/train_time"] = elapsed
        tokens = self.parallel.total([float(prepared.samples.num_tokens())])[0]
        out["perf/train_tokens_per_sec"] = tokens / elapsed if elapsed > 0 else 0.0
        if self.parallel.rank == 0:
            logger.info("rollout %d: %d optimizer step(s), loss %.4g, weight version %d", rollout_id, len(steps),
                        out.get("train/loss", float("nan")), self.weight_version)
        return out

    def prepare(self, train_data: dict[str, Any] | batches.TrainSamples,
                first_step: list[int] | None = None) -> Prepared:
        """Fix old log-probs, reference log-probs and advantages before any update. The samples
        in `first_step` get no old log-probs (None) when the trainer recomputes them and no hook
        reads them: the first step's training forward gives the same values."""
        samples = (train_data if isinstance(train_data, batches.TrainSamples)
                   else batches.TrainSamples.from_train_data(train_data).to(self.device))
        if self.keys["use_rollout_logprobs"]:
            if samples.rollout_log_probs is None:
                raise ValueError("trainer.use_rollout_logprobs needs rollout_log_probs in the train data")
            old: list[torch.Tensor | None] = [lp.clone() for lp in samples.rollout_log_probs]
        else:
            hooks_read_old = any(self._hooks[key] is not None for key in
                                 ("custom_advantage_function_path", "custom_loss_function_path"))
            skip = set() if hooks_read_old or first_step is None else set(first_step)
            old = self._no_grad_log_probs(self.model, samples, [i for i in range(len(samples)) if i not in skip])
        ref = None
        if self.keys["use_kl_loss"]:
            model = self.model  # loaded first: the reference is copied when the policy is
            with policy_model.reference_context(model, self._reference) as reference:
                ref = self._no_grad_log_probs(reference, samples)  # type: ignore[assignment]
        advantages = prep.advantages(samples, old, ref, self._hooks["custom_advantage_function_path"], self.args,
                                     self.device)
        return Prepared(samples, advantages, old, ref)

    def _no_grad_log_probs(self, model: Any, samples: batches.TrainSamples,
                           indices: list[int] | None = None) -> list[torch.Tensor | None]:
        """Response log-probs of the samples `indices` (all when None); None for the others."""
        out: list[torch.Tensor | None] = [None] * len(samples)
        with torch.no_grad():
            for mb, passes in self._plan(samples, list(range(len(samples))) if indices is None else indices,
                                         shared=bool(self.keys["share_prompt_forward"])):
                if mb is None:  # an empty micro-batch: this worker's share ran out before a peer's
                    self._log_probs(model, [prep.empty_tokens(self.device)], [1], False, passes)
                    continue
                lps, _ = self._log_probs(model, [samples.tokens[i] for i in mb],
                                         [samples.response_lengths[i] for i in mb], False, passes)
                for i, lp in zip(mb, lps):
                    out[i] = lp
        self.parallel.reshard(model)
        return out

    def _log_probs(self, model: Any, tokens: list[torch.Tensor], response_lengths: list[int],
                   with_entropy: bool, passes: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Response log-probs (and entropies, differentiated only when the loss has an entropy
        term): one forward per distinct prompt when `share_prompt_forward` (with at least
        `passes` response passes), else one per sample; equal up to rounding."""
        k = self.keys
        if k["share_prompt_forward"]:
            return shared_prompt_log_probs(model, tokens, response_lengths, k["rollout_temperature"], with_entropy,
                                           self._autocast(), entropy_grad=float(k["entropy_coef"]) != 0.0,
                                           min_passes=passes)
        return batches.response_log_probs(model, tokens, response_lengths, k["rollout_temperature"], with_entropy,
                                          self._autocast(), entropy_grad=float(k["entropy_coef"]) != 0.0)

    def _plan(self, samples: batches.TrainSamples, indices: list[int],
              shared: bool) -> list[tuple[list[int] | None, int]]:
        """This worker's micro-batches of `indices` and the response passes each runs (`shared`:
        through the shared-prompt forward; else one model call per micro-batch), padded
        with empty ones (None) to the most any worker has: every forward of a sharded model is
        a collective, so all workers make the same number of model calls (pipeline.train.parallel)."""
        k = self.keys
        max_tokens = k["max_tokens_per_gpu"] if k["use_dynamic_batch_size"] else None
        mbs: list[list[int] | None] = list(batches.micro_batches(indices, samples.total_lengths,
                                                                 k["micro_batch_size"], max_tokens))
        if isinstance(self.parallel, LocalParallel):
            return [(mb, 0) for mb in mbs]
        count = self.parallel.most([len(mbs)])[0]
        mbs += [None] * (count - len(mbs))
        mine = [response_passes([samples.response_lengths[i] for i in mb]) if shared and mb else 0 for mb in mbs]
        return list(zip(mbs, self.parallel.most(mine) if shared else mine))

    def accumulate(self, prepared: Prepared, indices: list[int], backward: bool) -> dict[str, float]:
        """Loss and metrics of the samples `indices` (one optimizer step; this worker's share
        of it), as shares of the whole step's batch means; gradients accumulate into the
        parameters when `backward`."""
        s, mode = prepared.samples, self.keys["loss_agg_mode"]
        # the whole step's normaliser: every worker's part of it, summed
        normalizer = max(self.parallel.total([s.normalizer_part(indices, mode)])[0], 1.0)
        scale = self.parallel.grad_scale / normalizer
        totals: dict[str, float] = {}
        # the custom loss reads the logits of one plain forward
        plan = self._plan(s, indices, shared=bool(self.keys["share_prompt_forward"])
                          and self.keys["loss_type"] != "custom_loss")
        for j, (mb, passes) in enumerate(plan):
            batch, tokens = prep.empty_micro_batch(prepared, self.device) if mb is None else prep.micro_batch(prepared, mb)
            reduce = sample_mean_reducer(batch.response_lengths, batch.loss_masks, mode,
                                         self.keys["loss_agg_norm_len"], batch.rollout_mask_sums)
            with self.parallel.micro_batch_sync(last=j == len(plan) - 1):
                loss, metrics = self.parallel.train_forward(self.model, self._micro_batch_loss, batch, tokens,
                                                            reduce, passes)
                if backward:
                    (loss * (0.0 if mb is None else scale)).backward()
            if mb is None:
                continue
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + float(value) / normalizer
        return totals

    def _micro_batch_loss(self, model: Any, batch: MicroBatch, tokens: list[torch.Tensor],
                          reduce: Callable[..., Any], passes: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """(loss, metrics) of one micro-batch as reducer sums, `model` called as the strategy
        wants it (`Parallel.train_forward`)."""
        if self.keys["loss_type"] == "custom_loss":
            return prep.custom_loss(self._hooks["custom_loss_function_path"], self.args, model, batch, tokens, reduce,
                                    self.device, bool(self.keys["bf16"]))
        log_probs, entropy = self._log_probs(model, tokens, batch.response_lengths, True, passes)
        # first-step samples: old log-probs = these, detached (prepare)
        batch.old_log_probs = [lp.detach() if old is None else old
                               for lp, old in zip(log_probs, batch.old_log_probs)]
        hooks = LossHooks(tis=self._hooks["custom_tis_function_path"],
                          pg_loss_reducer=self._hooks["custom_pg_loss_reducer_function_path"])
        return policy_loss(self.args, batch, log_probs, entropy, reduce, hooks)

    # -- weights and state ----------------------------------------------------------------------

    def weights_for_engine(self) -> dict[str, torch.Tensor]:
        """The policy under full HF state-dict names, LoRA merged (see model.merged_state_dict)."""
        return policy_model.merged_state_dict(self.model)

    def save_lora_adapter(self, directory: str) -> str:
        """The LoRA adapter as a peft folder (for engines that load adapters: vLLM)."""
        return policy_model.save_adapter(self.model, directory)

    def export_hf(self, directory: str) -> str:
        """The policy (LoRA merged) as a plain HF folder with the checkpoint's tokenizer."""
        k = self.keys
        folder = resolve_checkpoint(k["hf_checkpoint"], k["cache_dir"]) if k["hf_checkpoint"] is not None else None
        return policy_model.export_hf(self.model, folder, directory)

    def save(self, directory: str) -> None:
        """Write policy, optimizer, schedule position, RNG states and weight version (atomically)."""
        save_state(directory, self.model, self.optimizer,
                   {"weight_version": self.weight_version, "optimizer_step": self.optimizer_step})

    def load(self, directory: str) -> None:
        """Restore what `save` wrote."""
        _ = self.model  # loaded (and the KL reference copied) before the state replaces the weights
        if shards.is_sharded_state(directory):  # a distributed run's state (any number of workers)
            counters = load_sharded(directory, self.model, self.optimizer)
        else:
            counters = load_state(directory, self.model, self.optimizer)
        self.weight_version = int(counters["weight_version"])
        self.optimizer_step = int(counters["optimizer_step"])
        logger.info("trainer state loaded from %s (weight version %d)", directory, self.weight_version)
