"""Stages: call the rollout function (train branch); the rollout sample filter and all-samples hooks."""

from __future__ import annotations

import time

from pipeline.rollout.contracts import PluginOutputError, as_train_output
from pipeline.stages.context import RolloutContext, StageParts

__all__ = ["generate_stage", "sample_filter_stage"]


def generate_stage(ctx: RolloutContext, parts: StageParts) -> None:
    """`rollout_fn(args, rollout_id, data_source, evaluation=False)`; a bare list is wrapped."""
    start = time.perf_counter()
    out = as_train_output(
        parts.rollout_fn(parts.args, ctx.rollout_id, parts.data_source, evaluation=False), "rollout function"
    )
    ctx.rollout_time = time.perf_counter() - start
    if not isinstance(out.samples, list):
        raise PluginOutputError(
            f"rollout function: samples is {type(out.samples).__name__}; expected list[list[Sample]]")
    ctx.groups = out.samples
    ctx.all_groups = out.all_samples if out.all_samples is not None else out.samples
    ctx.extra_metrics = dict(out.metrics or {})


def sample_filter_stage(ctx: RolloutContext, parts: StageParts) -> None:
    """slime's rollout sample filter `fn(args, groups) -> None` (sets `remove_sample`), then its
    all-samples process `fn(args, all_samples, data_source) -> None`, in slime's order."""
    if parts.plugin("rollout_sample_filter") is not None:
        result = parts.plugin("rollout_sample_filter")(parts.args, ctx.groups)
        if result is not None:
            raise PluginOutputError(
                f"rollout sample filter returned {type(result).__name__}; expected None "
                f"(it marks samples with sample.remove_sample = True in place)")
    if parts.plugin("all_samples_process") is not None:
        parts.plugin("all_samples_process")(parts.args, ctx.all_groups, parts.data_source)
