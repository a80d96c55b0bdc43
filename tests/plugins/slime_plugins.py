"""slime-style plugins, written exactly in slime's signatures (docs/contracts.md §8), referenced by dotted path
from the command line (tests/test_cli.py). They use only `args.X` names slime has, and their own
output classes (accepted by shape, as slime's own classes would be)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from pipeline.samples.sample import Sample


@dataclass
class RolloutFnTrainOutput:  # stands in for slime.rollout.base_types.RolloutFnTrainOutput
    samples: list[list[Sample]]
    metrics: dict[str, Any] | None = None


@dataclass
class DynamicFilterOutput:  # stands in for slime.rollout.filter_hub.base_types.DynamicFilterOutput
    keep: bool
    reason: str | None = None


def load_function(path: str) -> Any:
    """slime.utils.misc.load_function."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _respond(args: Any, sample: Sample) -> None:
    """A fake policy: the answer is right for every third sample index."""
    correct = sample.index % 3 == 0
    text = f"The answer is {sample.label if correct else 'wrong'}."
    sample.response = text
    ids = [ord(c) % 250 for c in text][: args.rollout_max_response_len]
    sample.tokens = [1, 2, 3] + ids
    sample.response_length = len(ids)
    sample.reward = 1.0 if correct else 0.0
    sample.status = Sample.Status.COMPLETED


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """slime rollout function: over-sample, dynamic-filter via args.dynamic_sampling_filter_path,
    put the surplus back in the buffer (partial-rollout style)."""
    if evaluation:  # slime evaluates its own eval datasets, not the training source
        samples = [Sample(index=i, prompt=f"What is {i} + 1?", label=str(i + 1)) for i in range(6)]
        for s in samples:
            _respond(args, s)
        return {"toy": {"rewards": [s.reward for s in samples], "truncated": [False] * len(samples),
                        "samples": samples}}
    dynamic_filter = load_function(args.dynamic_sampling_filter_path) if args.dynamic_sampling_filter_path else None
    kept, dropped = [], 0
    while len(kept) < args.rollout_batch_size:
        for group in data_source.get_samples(args.over_sampling_batch_size):
            for s in group:
                if not s.response:
                    _respond(args, s)
            if len(kept) >= args.rollout_batch_size:
                data_source.add_samples([group])  # surplus back to the buffer
                continue
            verdict = dynamic_filter(args, group) if dynamic_filter else True
            if getattr(verdict, "keep", verdict):
                kept.append(group)
            else:
                dropped += 1
    kept.sort(key=lambda g: g[0].index)
    return RolloutFnTrainOutput(samples=kept, metrics={"rollout/slime_plugin_dropped": dropped})


def lifo_buffer_filter(args, rollout_id, buffer, num_samples):
    """slime buffer filter: newest groups first; marks what it serves."""
    num_samples = min(len(buffer), num_samples)
    out = buffer[-num_samples:] if num_samples else []
    del buffer[len(buffer) - num_samples:]
    for group in out:
        for s in group:
            s.metadata["served_from_buffer_at"] = rollout_id
    return out


def drop_first_group_filter(args, samples, **kwargs):
    """slime dynamic filter: drops group 0 of the dataset, keeps the rest."""
    if samples[0].group_index == 0:
        return DynamicFilterOutput(keep=False, reason="group0")
    return DynamicFilterOutput(keep=True)


def double_reward_post_process(args, samples):
    """slime custom reward post-process: rewards doubled, minus the group mean (n from args)."""
    raw = [s.get_reward_value(args) for s in samples]
    n = args.n_samples_per_prompt
    out = []
    for i in range(0, len(raw), n):
        chunk = raw[i:i + n]
        mean = sum(chunk) / len(chunk)
        out += [2.0 * (r - mean) for r in chunk]
    return raw, out


def convert_samples(args, samples):
    """slime custom convert: a minimal train-data dict."""
    return {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": [float(s.get_reward_value(args)) for s in samples],
        "sample_indices": [s.index for s in samples],
        "loss_masks": [[1] * s.response_length for s in samples],
        "converted_by": "slime_plugins",
    }


def remove_wrong_sample_filter(args, data):
    """slime rollout sample filter: samples with reward 0 do not train."""
    for group in data:
        for s in group:
            if s.get_reward_value(args) == 0:
                s.remove_sample = True


def rollout_log(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    """slime custom rollout log: writes its own marker file, keeps the default metrics."""
    import json
    import os

    with open(os.path.join(os.environ["SLIME_PLUGIN_LOG_DIR"], f"log_{rollout_id}.json"), "w") as fh:
        json.dump({"n": len(samples), "extra": rollout_extra_metrics, "time": rollout_time >= 0}, fh)
    return False
