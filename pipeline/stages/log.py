"""Stage: rollout metrics (docs/contracts.md §7 names) and eval metrics; the custom rollout log hook.

The hook `fn(rollout_id, args, samples, extra_metrics, rollout_time) -> bool` runs first;
True skips the default rollout metrics (perf and stage timings are still logged).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

from pipeline.samples.sample import Sample
from pipeline.stages.rewards import raw_reward_values
from pipeline.stages.context import RolloutContext, StageParts

__all__ = ["eval_metrics", "log_stage", "pass_at_k", "rollout_metrics"]


def _group_rewards(samples: list[Any], rewards: list[float]) -> list[list[float]]:
    groups: dict[Any, list[float]] = {}
    for i, (s, r) in enumerate(zip(samples, rewards)):
        key = s.group_index if s.group_index is not None else ("solo", i)
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def rollout_metrics(args: Any, samples: list[Any], rollout_time: float) -> dict[str, float]:
    """Default train metrics of one rollout (docs/contracts.md §7)."""
    lengths = [int(s.response_length) for s in samples]
    raw = raw_reward_values(args, samples)
    truncated = Sample.Status.TRUNCATED.value
    out: dict[str, float] = {
        "rollout/response_len/mean": statistics.fmean(lengths),
        "rollout/response_len/median": float(statistics.median(lengths)),
        "rollout/response_len/max": float(max(lengths)),
        "rollout/response_len/min": float(min(lengths)),
        "rollout/raw_reward": statistics.fmean(raw),
        # fraction of samples with raw reward > 0 (the report's and the progress line's pass rate)
        "rollout/pass_rate": sum(r > 0 for r in raw) / len(raw),
        "rollout/truncated_ratio": sum(
            str(getattr(s.status, "value", s.status)) == truncated for s in samples) / len(samples),
        "rollout/num_samples": float(len(samples)),
    }
    zero_std: Counter[float] = Counter()
    for rewards in _group_rewards(samples, raw):
        if len(rewards) > 1 and max(rewards) == min(rewards):
            zero_std[round(float(rewards[0]), 1)] += 1
    for r, count in sorted(zero_std.items()):
        out[f"rollout/zero_std/count_{r}"] = float(count)
    out["perf/rollout_time"] = rollout_time
    out["perf/tokens_per_sec"] = sum(lengths) / rollout_time if rollout_time > 0 else 0.0
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_metrics(args: Any, data: dict[str, dict[str, Any]]) -> dict[str, float]:
    """`eval/<name>`, `eval/<name>-truncated_ratio`, `eval/<name>-pass@k` for each dataset."""
    out: dict[str, float] = {}
    k = int(args.n_samples_per_eval_prompt)
    for name, d in data.items():
        rewards, truncated = list(d["rewards"]), list(d.get("truncated", []))
        if not rewards:
            continue
        if any(isinstance(r, bool) or not isinstance(r, (int, float)) for r in rewards):
            raise ValueError(f"eval dataset {name!r}: rewards must be numbers (set eval_reward_key for dicts)")
        out[f"eval/{name}"] = statistics.fmean(rewards)
        if truncated:
            out[f"eval/{name}-truncated_ratio"] = sum(bool(t) for t in truncated) / len(truncated)
        if k > 1 and len(rewards) % k == 0:
            groups = [rewards[i : i + k] for i in range(0, len(rewards), k)]
            out[f"eval/{name}-pass@{k}"] = statistics.fmean(
                pass_at_k(k, sum(r > 0 for r in g), k) for g in groups)
        out[f"eval/{name}-pass@1"] = statistics.fmean(float(r > 0) for r in rewards)
    return out


def log_stage(ctx: RolloutContext, parts: StageParts) -> None:
    """Fill ctx.metrics: the hook's verdict, default metrics, extra metrics, buffer size."""
    skip = False
    if parts.plugin("rollout_log") is not None:
        skip = bool(parts.plugin("rollout_log")(ctx.rollout_id, parts.args, ctx.samples, ctx.extra_metrics, ctx.rollout_time))
    # the rollout function's own metrics first; the default ones (docs/contracts.md §7 names) win on a clash
    for key, value in (ctx.extra_metrics or {}).items():
        ctx.metrics[key if "/" in key else f"rollout/{key}"] = value
    if not skip:
        ctx.metrics.update(rollout_metrics(parts.args, ctx.samples, ctx.rollout_time))
    filter_metrics = getattr(getattr(parts.data_source, "buffer_filter", None), "metrics", None)
    if callable(filter_metrics):
        ctx.metrics.update(filter_metrics())
    length = getattr(parts.data_source, "get_buffer_length", None)
    if callable(length):
        ctx.metrics["rollout/buffer_size"] = float(length())
