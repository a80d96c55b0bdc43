"""Pre-flight checks of the `trainer` node (called by `validate` through config_rules): each
problem names the key, the value and what is expected, before anything is built."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pipeline.cluster import devices
from pipeline.engines.preflight import has_trainer
from pipeline.config.plugins import target_of
from pipeline.process.precision import AUTO
from pipeline.process.threads import planned_threads, torch_threads_problem
from pipeline.train.choices import KL_LOSS_TYPES, LOSS_AGG_MODES, LR_DECAY_STYLES

__all__ = ["async_problems", "async_warnings", "trainer_problems", "trainer_warnings"]

# trainer=policy_gradient's target, and the class it names in configs written before it built
# the distributed driver too (runs stored by earlier versions, users' own YAML)
_POLICY_GRADIENT = ("pipeline.train.build.policy_gradient_trainer",
                    "pipeline.train.policy_gradient.PolicyGradientTrainer")
_FUNCTION = "pipeline.train.function.FunctionTrainer"
_CHOICES = {"kl_loss_type": KL_LOSS_TYPES, "loss_agg_mode": LOSS_AGG_MODES, "lr_decay_style": LR_DECAY_STYLES,
            "loss_type": ("policy_loss", "custom_loss")}
_POSITIVE_INTS = ("micro_batch_size", "keep_states")
_BOOLEANS = ("fsdp_reshard_after_forward", "share_prompt_forward", "use_dynamic_batch_size", "use_kl_loss",
             "use_unbiased_kl", "use_rollout_logprobs", "use_tis", "use_opsm", "get_mismatch_metrics")
_NON_NEGATIVE = ("lr", "min_lr", "weight_decay", "clip_grad", "eps_clip", "entropy_coef", "kl_loss_coef",
                 "tis_clip_low", "lr_warmup_iters", "lora_rank", "opsm_delta")
# where it trains (trainer.num_workers > 1: Ray workers in one torch.distributed process group)
_WHERE_CHOICES = {"strategy": ("fsdp2", "ddp"), "device": devices.DEVICES, "backend": devices.BACKENDS,
                  "placement_strategy": ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"),
                  "param_dtype": ("float32", "bfloat16"), "gloo_collectives": ("broadcast", "native")}
_POSITIVE_NUMBERS = ("num_cpus_per_worker", "collective_timeout_s")
_HF_ENGINE = "pipeline.engines.hf.HFEngine"
_RAY_ENGINE = "pipeline.engines.ray_pool.RayEngine"


def trainer_problems(cfg: dict[str, Any]) -> list[str]:
    """Problems of `cfg["trainer"]` (empty: fine, or no trainer)."""
    node = cfg.get("trainer")
    if not isinstance(node, dict):
        return []
    target = node.get("_target_")
    if target == _FUNCTION and not node.get("train_function_path"):
        return ["trainer=function needs trainer.train_function_path=<pkg.module.train> (your train(args, rollout_id, train_data) "
                "-> metrics)"]
    if target not in _POLICY_GRADIENT:
        return []
    out: list[str] = []
    for key, choices in _CHOICES.items():
        if node.get(key) not in choices:
            out.append(f"trainer.{key}={node.get(key)!r}: expected one of {list(choices)}")
    for key in _POSITIVE_INTS:
        if not _is_int(node.get(key)) or node[key] < 1:
            out.append(f"trainer.{key}={node.get(key)!r}: expected an integer >= 1")
    threads_problem = torch_threads_problem(node.get("num_threads"))
    if threads_problem:
        out.append(threads_problem)
    if not isinstance(node.get("bf16"), bool) and node.get("bf16") != AUTO:
        out.append(f"trainer.bf16={node.get('bf16')!r}: expected true, false or auto")
    for key in _BOOLEANS:
        if not isinstance(node.get(key), bool):
            out.append(f"trainer.{key}={node.get(key)!r}: expected true or false")
    for key in _NON_NEGATIVE:
        if not _is_number(node.get(key)) or node[key] < 0:
            out.append(f"trainer.{key}={node.get(key)!r}: expected a number >= 0")
    attn = node.get("attn_implementation")
    if attn is not None and not isinstance(attn, str):
        out.append(f"trainer.attn_implementation={attn!r}: expected null (transformers' default) or a name "
                   "such as eager or sdpa")
    gbs = node.get("global_batch_size")
    if gbs is not None and (not _is_int(gbs) or gbs < 1):
        out.append(f"trainer.global_batch_size={gbs!r}: expected null (the whole rollout) or an integer >= 1")
    if node.get("use_dynamic_batch_size") and not (_is_int(node.get("max_tokens_per_gpu"))
                                                   and node["max_tokens_per_gpu"] >= 1):
        out.append(f"trainer.use_dynamic_batch_size=true needs trainer.max_tokens_per_gpu >= 1 (got "
                   f"{node.get('max_tokens_per_gpu')!r})")
    clip_c = node.get("eps_clip_c")
    if clip_c is not None and (not _is_number(clip_c) or clip_c <= 1.0):
        out.append(f"trainer.eps_clip_c={clip_c!r}: the dual-clip bound must be > 1 (or null: off)")
    if node.get("loss_agg_mode") == "seq-mean-token-sum-norm" and not (
            _is_int(node.get("loss_agg_norm_len")) and node["loss_agg_norm_len"] >= 1):
        out.append(f"trainer.loss_agg_mode=seq-mean-token-sum-norm needs trainer.loss_agg_norm_len >= 1 (got "
                   f"{node.get('loss_agg_norm_len')!r})")
    if node.get("loss_type") == "custom_loss" and not node.get("custom_loss_function_path"):
        out.append("trainer.loss_type=custom_loss needs trainer.custom_loss_function_path=<pkg.module.fn>")
    if node.get("use_rollout_logprobs") and node.get("use_tis"):
        out.append("trainer.use_rollout_logprobs and trainer.use_tis together: TIS weighs the trainer's old "
                   "log-probs against the rollout's, which are then the same (slime refuses this too)")
    return out + _where_problems(cfg, node)


def trainer_warnings(cfg: dict[str, Any]) -> list[str]:
    """Valid but probably unintended trainer settings: more torch threads in the CPU workers of a
    local Ray than this machine has CPUs (they contend for cores; every step gets slower)."""
    node = cfg.get("trainer")
    if not isinstance(node, dict) or node.get("_target_") not in _POLICY_GRADIENT or _where_key_problems(node):
        return []
    try:
        where = _where(cfg, node)
    except devices.DeviceError:
        return []  # a problem (trainer_problems), not a warning
    value, cpus = node.get("num_threads"), os.cpu_count()
    if (where.workers == 1 or where.device != "cpu" or not where.local or torch_threads_problem(value)
            or cpus is None):
        return []
    threads = planned_threads(value, where.workers, node["num_cpus_per_worker"])
    if where.workers * threads <= cpus:
        return []
    said = f"trainer.num_threads={threads}" if value != AUTO else \
        f"trainer.num_threads=auto ({threads}: trainer.num_cpus_per_worker={node['num_cpus_per_worker']})"
    fewer_threads = max(cpus // where.workers, 1)
    fix = f"trainer.num_threads={fewer_threads} or " if fewer_threads < threads else ""
    return [f"trainer.num_workers={where.workers} x {said} = {where.workers * threads} "
            f"torch threads on the CPU, more than this machine's {cpus} CPUs (os.cpu_count()): the workers "
            f"contend for cores and every step gets slower; set {fix}fewer workers "
            f"(trainer.num_workers={max(cpus // threads, 1)})"]


@dataclass(frozen=True)
class _Where:
    """Where the policy-gradient trainer trains, as far as pre-flight can tell."""

    workers: int
    # "cpu" | "cuda"; None: not known here (the Ray cluster's nodes decide, or only torch could
    # tell and nothing needs it)
    device: str | None
    # GPUs of this machine (None: not counted)
    gpus: int | None
    # the workers run on this machine (in this process, or a local Ray started for them)
    local: bool


def _where_key_problems(node: dict[str, Any]) -> list[str]:
    """Problems of the keys saying where the trainer trains, each on its own."""
    out: list[str] = []
    workers = node.get("num_workers")
    if not _is_int(workers) or workers < 1:
        out.append(f"trainer.num_workers={workers!r}: expected an integer >= 1 (1: train in this process; "
                   f"N > 1: N Ray workers)")
    for key, choices in _WHERE_CHOICES.items():
        if node.get(key) not in choices:
            out.append(f"trainer.{key}={node.get(key)!r}: expected one of {list(choices)}")
    if not isinstance(node.get("release_freed_memory"), bool) and node.get("release_freed_memory") != AUTO:
        out.append(f"trainer.release_freed_memory={node.get('release_freed_memory')!r}: expected true, false or auto")
    for key in _POSITIVE_NUMBERS:
        if not _is_number(node.get(key)) or node[key] <= 0:
            out.append(f"trainer.{key}={node.get(key)!r}: expected a number > 0")
    address = node.get("address")
    if address is not None and (not isinstance(address, str) or not address.strip()):
        out.append(f"trainer.address={address!r}: expected null (the run's Ray, or a local one) or a Ray "
                   f"address such as auto or ray://host:port")
    if node.get("param_dtype") == "bfloat16" and (node.get("strategy") != "fsdp2" or workers == 1):
        out.append(f"trainer.param_dtype=bfloat16 is FSDP2's mixed precision: it needs trainer.num_workers > 1 and "
                   f"trainer.strategy=fsdp2 (got num_workers={workers!r}, strategy={node.get('strategy')!r}); "
                   f"elsewhere use trainer.bf16=true (autocast)")
    wrap = node.get("fsdp_wrap_modules")
    if wrap is not None and (not isinstance(wrap, list)
                             or not all(isinstance(x, str) and x.strip() for x in wrap)):
        out.append(f"trainer.fsdp_wrap_modules={wrap!r}: expected null (the model's own _no_split_modules) or "
                   f"a list of module class names such as [LlamaDecoderLayer]")
    return out


def _joins_a_cluster(cfg: dict[str, Any], node: dict[str, Any]) -> bool:
    """Whether N workers join a Ray cluster: trainer.address, else engine=ray's (neither: a local Ray)."""
    if node.get("address") is not None:
        return True
    engine = cfg.get("engine")
    # engine.address is optional for the ray engine (RayEngine's own default is None)
    return target_of(engine) == _RAY_ENGINE and engine.get("address") is not None


def _where(cfg: dict[str, Any], node: dict[str, Any]) -> _Where:
    """Where the trainer trains (its keys valid: `_where_key_problems` found nothing); raises
    DeviceError for a device this machine cannot give it. torch is asked for its GPU count only
    when the answer needs it: device=cuda, or auto with N workers on a machine that may have GPUs."""
    workers, choice = node["num_workers"], node["device"]
    local = workers == 1 or not _joins_a_cluster(cfg, node)
    if choice == "cpu":
        return _Where(workers, "cpu", None, local)
    if not local:  # the workers' nodes decide what auto means and have the GPUs: nothing to check here
        return _Where(workers, None, None, local)
    visible = devices.visible_gpus()
    if visible == 0:
        gpus: int | None = 0
    elif choice == "cuda" or workers > 1:
        gpus = devices.cuda_device_count()
    else:  # auto in this process: only torch could tell, and nothing below needs it
        return _Where(workers, None, None, local)
    return _Where(workers, devices.resolve_device(choice, "trainer.device", gpus), gpus, local)


def _engine_gpu(cfg: dict[str, Any]) -> bool:
    """Whether the hf engine keeps a GPU of its own beside a CUDA trainer: engine.device cuda or
    auto (auto is CUDA where the trainer's is), engine.colocate not true. engine.device and
    engine.colocate are new to conf/engine/hf.yaml (issue 29) and may be absent from an engine
    node: no device is the CPU engine of before, no colocate a GPU of its own; a bad device is
    the engine's own checks' to report."""
    engine = cfg.get("engine")
    return (target_of(engine) == _HF_ENGINE and engine.get("device") in ("cuda", "auto")
            and engine.get("colocate") is not True)


def _where_problems(cfg: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """Problems of where the trainer trains: its keys, the device and backend this machine can
    give it, one GPU per worker, and a global batch every worker gets a share of."""
    out = _where_key_problems(node)
    if out:
        return out
    try:
        where = _where(cfg, node)
    except devices.DeviceError as exc:
        return [str(exc)]
    if where.device is not None:
        try:
            devices.resolve_backend(node["backend"], where.device)  # its key: trainer.backend
        except devices.DeviceError as exc:
            out.append(str(exc))
    if where.device == "cuda" and where.local and where.gpus is not None:
        out += _gpu_problems(cfg, where.workers, where.gpus)
    if where.workers > 1:
        out += _split_problems(cfg, node, where.workers)
    return out


def _gpu_problems(cfg: dict[str, Any], workers: int, gpus: int) -> list[str]:
    """More CUDA workers than this machine's `gpus` (less the hf engine's own)."""
    engine = _engine_gpu(cfg)
    free = gpus - int(engine)
    if workers <= free:
        return []
    kept = " and the hf engine keeps one of its own (engine.colocate=false)" if engine else ""
    fixes = ([f"trainer.num_workers={free}"] if free >= 1 else []) + (
        ["engine.colocate=true (the engine shares worker 0's GPU)", "engine.device=cpu"] if engine else []) + [
        "trainer.device=cpu"] + (["trainer.address=<a Ray cluster with more GPUs>"] if workers > 1 else [])
    return [f"trainer.num_workers={workers} on CUDA needs one GPU per worker, but this machine has "
            f"{gpus} GPU(s){kept}: {free} for the trainer; set {', '.join(fixes[:-1])} or {fixes[-1]}"]


def _split_problems(cfg: dict[str, Any], node: dict[str, Any], workers: int) -> list[str]:
    """An optimizer step with fewer samples than workers (some worker would get none of it)."""
    gbs, rbs, n = node.get("global_batch_size"), cfg.get("rollout_batch_size"), cfg.get("n_samples_per_prompt")
    if _is_int(gbs) and 1 <= gbs < workers:
        return [f"trainer.num_workers={workers}: trainer.global_batch_size={gbs} samples per optimizer step cannot "
                f"be split over {workers} workers (each needs at least one sample); set "
                f"trainer.global_batch_size >= {workers} (or null: the whole rollout) or trainer.num_workers <= {gbs}"]
    if not (_is_int(rbs) and _is_int(n) and rbs >= 1 and n >= 1) or rbs * n >= workers:
        return []
    step = ("trainer.global_batch_size=null: the whole rollout" if gbs is None else
            f"trainer.global_batch_size={gbs} is capped at the whole rollout")
    return [f"trainer.num_workers={workers}: an optimizer step ({step}, rollout_batch_size={rbs} x "
            f"n_samples_per_prompt={n} = {rbs * n} samples) cannot be split over {workers} workers (each needs "
            f"at least one sample); raise rollout_batch_size or n_samples_per_prompt, or set "
            f"trainer.num_workers <= {rbs * n}"]


def async_problems(cfg: dict[str, Any]) -> list[str]:
    """Problems of `train_async` / `max_weight_staleness` (pipeline.loop.runner_async)."""
    out: list[str] = []
    mode, bound = cfg.get("train_async"), cfg.get("max_weight_staleness")
    if not isinstance(mode, bool):
        out.append(f"train_async: expected true or false, got {mode!r}")
    if not _is_int(bound) or bound < 1:
        out.append(f"max_weight_staleness: expected an integer >= 1 (how many weight versions generation runs "
                   f"behind the trainer), got {bound!r}")
    if mode is True:
        if not has_trainer(cfg):
            out.append("train_async: true overlaps generation with training, but trainer=none trains nothing; "
                       "choose a trainer (trainer=policy_gradient or trainer=function) or set train_async=false")
    return out


def async_warnings(cfg: dict[str, Any]) -> list[str]:
    """Valid but probably unintended: an async run whose checkpoints leave nothing to overlap, or
    a staleness bound without the async mode."""
    bound = cfg.get("max_weight_staleness")
    if cfg.get("train_async") is False and _is_int(bound) and bound != 1:
        return [f"max_weight_staleness={bound} has no effect without train_async=true (sync mode trains each "
                f"rollout before the next is generated)"]
    if cfg.get("train_async") is True and cfg.get("save_interval") == 1 and _is_int(cfg.get("num_rollout")) \
            and cfg["num_rollout"] > 1:
        return ["train_async: true with save_interval=1: every checkpoint waits for its rollout's training "
                "before the next rollout is generated, so nothing overlaps; set save_interval > 1 "
                "(e.g. save_interval=10)"]
    return []


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
