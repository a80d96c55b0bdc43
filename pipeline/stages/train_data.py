"""Stage: convert samples to slime-keyed train data, plus padded tensors for a trainer (docs/contracts.md §7).

Keys (slime's names, so slime's trainer-side code reads them unchanged): tokens,
response_lengths, rewards, raw_reward (per sample `metadata["raw_reward"]` when any sample has
one, else the raw reward), truncated (1 iff TRUNCATED), sample_indices, rollout_ids (None
filled by a counter skipping ids in use), loss_masks (None -> all ones; remove_sample -> zeros),
rollout_mask_sums (per sample: the sum of the loss-mask totals of every sample sharing its
rollout_id), source_names (`sample.source`, else `metadata["source_name"]`, else "unknown"),
and when samples carry them: round_number (`metadata["round_number"]`, None where missing),
metadata (each sample's `train_metadata`), multimodal_train_inputs.
Per-token lists (rollout_log_probs, teacher_log_probs) and rollout_routed_experts are written
when every sample has them; when only some do, the key is left out with a warning (slime looks
at the first sample only, so its result depends on the order).
A custom hook `fn(args, samples) -> dict` replaces this stage; a rollout data
post-process hook may then edit the result in place.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from pipeline.config.plugins import positional_count
from pipeline.samples.sample import Sample
from pipeline.stages.context import RolloutContext, StageParts

__all__ = ["convert_to_train_data", "fill_rollout_ids", "source_name", "train_data_stage"]

logger = logging.getLogger(__name__)


def fill_rollout_ids(ids: list[int | None]) -> list[int]:
    """Replace None by 0, 1, 2, ... skipping ids already in use."""
    used = {i for i in ids if i is not None}
    counter = 0
    out: list[int] = []
    for i in ids:
        if i is None:
            while counter in used:
                counter += 1
            used.add(counter)
            i = counter
        out.append(int(i))
    return out


def _loss_mask(s: Any) -> list[int]:
    mask = [1] * s.response_length if s.loss_mask is None else list(s.loss_mask)
    if len(mask) != s.response_length:
        raise ValueError(
            f"sample {s.index}: loss_mask has {len(mask)} entries but response_length is "
            f"{s.response_length}; they must be equal"
        )
    if s.remove_sample:
        mask = [0] * s.response_length
    return mask


def convert_to_train_data(args: Any, samples: list[Any], raw_rewards: list[Any], rewards: list[Any]) -> dict[str, Any]:
    """slime's `_convert_samples_to_train_data` over already post-processed rewards."""
    truncated = Sample.Status.TRUNCATED.value
    loss_masks = [_loss_mask(s) for s in samples]
    rollout_ids = fill_rollout_ids([s.rollout_id for s in samples])
    totals: dict[int, int] = defaultdict(int)
    for rid, mask in zip(rollout_ids, loss_masks):
        totals[rid] += sum(mask)
    data: dict[str, Any] = {
        "tokens": [list(s.tokens) for s in samples],
        "response_lengths": [int(s.response_length) for s in samples],
        "rewards": list(rewards),
        "raw_reward": list(raw_rewards),
        "truncated": [1 if str(getattr(s.status, "value", s.status)) == truncated else 0 for s in samples],
        "sample_indices": [s.index for s in samples],
        "rollout_ids": rollout_ids,
        "loss_masks": loss_masks,
        "rollout_mask_sums": [totals[rid] for rid in rollout_ids],
    }
    metadata = [s.metadata if isinstance(s.metadata, dict) else {} for s in samples]
    if any("raw_reward" in m for m in metadata):
        data["raw_reward"] = [m.get("raw_reward", raw) for m, raw in zip(metadata, raw_rewards)]
    if any("round_number" in m for m in metadata):
        data["round_number"] = [m.get("round_number") for m in metadata]
    for key, as_floats in (("rollout_log_probs", True), ("teacher_log_probs", True), ("rollout_routed_experts", False)):
        rows = _when_all_have(samples, key)
        if rows is not None:
            data[key] = [list(map(float, r)) for r in rows] if as_floats else [list(r) for r in rows]
    for key, attr in (("metadata", "train_metadata"), ("multimodal_train_inputs", "multimodal_train_inputs")):
        values = [getattr(s, attr, None) for s in samples]
        if any(v is not None for v in values):
            data[key] = values
    data["source_names"] = [source_name(s, m) for s, m in zip(samples, metadata)]
    return data


def source_name(sample: Any, metadata: dict[str, Any]) -> str:
    """slime's `get_source`: `sample.source`, else `metadata["source_name"]`, else "unknown"."""
    return getattr(sample, "source", None) or metadata.get("source_name") or "unknown"


def _when_all_have(samples: list[Any], attr: str) -> list[Any] | None:
    """`[s.attr for s in samples]` when every sample has it (not None); None when none has it
    or, with a warning, when only some do."""
    values = [getattr(s, attr, None) for s in samples]
    missing = [s.index for s, v in zip(samples, values) if v is None]
    if samples and not missing:
        return values
    if len(missing) < len(samples):
        logger.warning("%s present on %d of %d samples (missing on samples %s); the train data leaves "
                       "%s out for this rollout", attr, len(samples) - len(missing), len(samples),
                       missing[:10], attr)
    return None


def train_data_stage(ctx: RolloutContext, parts: StageParts) -> None:
    """Run the custom convert hook when configured, else `convert_to_train_data`; then slime's
    rollout data post-process `fn(args, rollout_id, rollout_data)` (or `fn(args)`) on the result."""
    if parts.plugin("convert_to_train_data") is not None:
        data = parts.plugin("convert_to_train_data")(parts.args, ctx.samples)
        if not isinstance(data, dict):
            raise TypeError(f"convert hook returned {type(data).__name__}; expected a dict of lists")
        ctx.train_data = data
    else:
        ctx.train_data = convert_to_train_data(parts.args, ctx.samples, ctx.raw_rewards, ctx.rewards)
    postprocess = parts.plugin("rollout_data_postprocess")
    if postprocess is not None:
        if positional_count(postprocess) == 1:  # slime's older form
            postprocess(parts.args)
        else:
            postprocess(parts.args, ctx.rollout_id, ctx.train_data)
