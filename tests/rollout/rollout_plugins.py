"""Custom generate plugins used by the rollout tests (slime's signature)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.rollout.sample_generate import generate


async def fanout_generate(args: Any, sample: Any, sampling_params: dict) -> list[Any]:
    """Two siblings per sample (e.g. two turns), without rollout_id: the rollout assigns one."""
    first = await generate(args, sample, sampling_params)
    second = dataclasses.replace(first, tokens=list(first.tokens), metadata=dict(first.metadata),
                                 loss_mask=list(first.loss_mask or []), reward=None,
                                 rollout_log_probs=list(first.rollout_log_probs or []))
    return [first, second]


async def tagged_generate(args: Any, sample: Any, sampling_params: dict, evaluation: bool = False) -> Any:
    """Default generate, recording the evaluation flag and the sampling params it was given."""
    sample.metadata["evaluation"] = evaluation
    sample.metadata["max_new_tokens"] = sampling_params["max_new_tokens"]
    return await generate(args, sample, sampling_params)


async def new_sample_generate(args: Any, sample: Any, sampling_params: dict) -> Any:
    """Generates into a copy and returns the copy (the given sample stays as it was)."""
    copy = dataclasses.replace(sample, tokens=list(sample.tokens), metadata=dict(sample.metadata))
    return await generate(args, copy, sampling_params)


async def bad_generate(args: Any, sample: Any, sampling_params: dict) -> Any:
    """Returns something that is not a Sample."""
    return 42


GROUP_SIZES: list[int] = []


async def group_reward(args: Any, samples: list[Any]) -> list[float]:
    """Group-mode reward: rank within the group (records the group sizes it was called with)."""
    GROUP_SIZES.append(len(samples))
    order = sorted(range(len(samples)), key=lambda i: samples[i].response_length)
    return [float(order.index(i)) for i in range(len(samples))]
