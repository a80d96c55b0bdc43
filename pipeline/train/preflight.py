"""Pre-flight checks of the `trainer` node (called by `validate` through config_rules): each
problem names the key, the value and what is expected, before anything is built."""

from __future__ import annotations

from typing import Any

from pipeline.engines.preflight import has_trainer
from pipeline.precision import AUTO
from pipeline.train.choices import KL_LOSS_TYPES, LOSS_AGG_MODES, LR_DECAY_STYLES

__all__ = ["async_problems", "async_warnings", "trainer_problems"]

_POLICY_GRADIENT = "pipeline.train.policy_gradient.PolicyGradientTrainer"
_FUNCTION = "pipeline.train.function.FunctionTrainer"
_CHOICES = {"kl_loss_type": KL_LOSS_TYPES, "loss_agg_mode": LOSS_AGG_MODES, "lr_decay_style": LR_DECAY_STYLES,
            "loss_type": ("policy_loss", "custom_loss")}
_POSITIVE_INTS = ("micro_batch_size", "num_threads")
_BOOLEANS = ("share_prompt_forward", "use_dynamic_batch_size", "use_kl_loss", "use_unbiased_kl",
             "use_rollout_logprobs", "use_tis")
_NON_NEGATIVE = ("lr", "min_lr", "weight_decay", "clip_grad", "eps_clip", "entropy_coef", "kl_loss_coef",
                 "tis_clip_low", "lr_warmup_iters", "lora_rank")


def trainer_problems(cfg: dict[str, Any]) -> list[str]:
    """Problems of `cfg["trainer"]` (empty: fine, or no trainer)."""
    node = cfg.get("trainer")
    if not isinstance(node, dict):
        return []
    target = node.get("_target_")
    if target == _FUNCTION and not node.get("train_function_path"):
        return ["trainer=function needs trainer.train_function_path=<pkg.module.train> (your train(args, rollout_id, train_data) "
                "-> metrics)"]
    if target != _POLICY_GRADIENT:
        return []
    out: list[str] = []
    for key, choices in _CHOICES.items():
        if node.get(key) not in choices:
            out.append(f"trainer.{key}={node.get(key)!r}: expected one of {list(choices)}")
    for key in _POSITIVE_INTS:
        if not _is_int(node.get(key)) or node[key] < 1:
            out.append(f"trainer.{key}={node.get(key)!r}: expected an integer >= 1")
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
    return out


def async_problems(cfg: dict[str, Any]) -> list[str]:
    """Problems of `train_async` / `max_weight_staleness` (pipeline.runner_async)."""
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
