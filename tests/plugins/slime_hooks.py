"""slime-shaped hooks, data source, custom generates and a reward dispatcher, each written in
slime's exact signature (slime @624b824: `slime/rollout/sample_hooks.py`, `slime/ray/rollout.py`,
`slime/rollout/sglang_rollout.py`, `slime/rollout/rm_hub/__init__.py`), named by dotted path
from the command line in tests/test_slime_hooks_cli.py.

Every hook appends one JSON line per call to `<args.hook_log_dir>/<hook>.jsonl`: `hook_log_dir`
is a slime-style arg this config does not have, set with `+hook_log_dir=...` as docs/slime.md says.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
from typing import Any

from pipeline.samples.sample import Sample


def _log(args: Any, hook: str, record: dict[str, Any]) -> None:
    with open(os.path.join(args.hook_log_dir, f"{hook}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def load_function(path: str) -> Any:
    """slime.utils.misc.load_function."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


# ------------------------------------------------------------------ rollout sample hooks
def stamp_sample(args, sample, *, rollout_id=None, evaluation=False):
    """Sample hook (sync, names both keywords): records when it ran; edits in place."""
    sample.metadata.setdefault("hooks", []).append("stamp")
    _log(args, "sample_hook", {"index": sample.index, "rollout_id": rollout_id, "evaluation": evaluation,
                               "reward_was_none": sample.reward is None, "status": str(sample.status),
                               "response_length": sample.response_length})


async def replace_sample(args, sample):
    """Sample hook (async, no keywords): returns the Sample that replaces the original."""
    await asyncio.sleep(0)
    sample.metadata.setdefault("hooks", []).append("replace")
    return sample


def bad_sample_hook(args, sample):
    """Returns something that is neither None nor a Sample."""
    return {"not": "a sample"}


# ------------------------------------------------------------------ all samples / postprocess / logs
def all_samples_process(args, all_samples, data_source):
    """slime's `--rollout-all-samples-process-path`: every group, dropped ones included."""
    _log(args, "all_samples", {
        "groups": [[s.index for s in group] for group in all_samples],
        "removed": [s.index for group in all_samples for s in group if s.remove_sample],
        "has_buffer_api": all(hasattr(data_source, m) for m in ("get_samples", "add_samples")),
    })


def remove_odd_groups(args, samples):
    """slime's `--rollout-sample-filter-path`: marks every sample of odd-numbered groups."""
    for group in samples:
        for s in group:
            s.remove_sample = s.group_index % 2 == 1


def rollout_data_postprocess(args, rollout_id, rollout_data):
    """slime's `--rollout-data-postprocess-path` (current form): edits the train data in place."""
    _log(args, "postprocess", {"rollout_id": rollout_id, "keys": sorted(rollout_data),
                               "rewards": list(rollout_data["rewards"])})
    rollout_data["postprocessed_rollout_id"] = [rollout_id] * len(rollout_data["tokens"])


def rollout_data_postprocess_args_only(args):
    """slime's older `--rollout-data-postprocess-path` form: args only."""
    _log(args, "postprocess_old", {"called": True})


def eval_log(rollout_id, args, data, extra_metrics):
    """slime's `--custom-eval-rollout-log-function-path`: True skips the default eval metrics."""
    _log(args, "eval_log", {"rollout_id": rollout_id, "datasets": sorted(data),
                            "n": {k: len(v["rewards"]) for k, v in data.items()}})
    extra_metrics["eval/hooked_mean"] = sum(sum(v["rewards"]) for v in data.values()) / sum(
        len(v["rewards"]) for v in data.values())
    return True


def train_log(rollout_id, args, samples, extra_metrics, rollout_time):
    """slime's `--custom-rollout-log-function-path` (keeps the default metrics)."""
    return False


# ------------------------------------------------------------------ data source (--data-source-path)
class ListDataSource:
    """A data source in slime's shape: constructed `cls(args)`, prompts from `args.prompt_data`."""

    def __init__(self, args):
        self.args = args
        with open(args.prompt_data, encoding="utf-8") as f:
            self.rows = [json.loads(line) for line in f if line.strip()]
        self.offset = 0
        self.sample_index = 0
        self.group_index = 0
        self.buffer: list[list[Sample]] = []
        self.saved: list[int] = []

    def get_samples(self, num_samples):
        out = self.buffer[:num_samples]
        del self.buffer[:num_samples]
        while len(out) < num_samples:
            row = self.rows[self.offset % len(self.rows)]
            self.offset += 1
            group = []
            for _ in range(self.args.n_samples_per_prompt):
                group.append(Sample(group_index=self.group_index, index=self.sample_index,
                                    prompt=row[self.args.input_key], label=row["label"],
                                    metadata={"from": "ListDataSource"}))
                self.sample_index += 1
            self.group_index += 1
            out.append(group)
        return out

    def add_samples(self, samples):
        self.buffer.extend(samples)

    def save(self, rollout_id):
        self.saved.append(rollout_id)
        _log(self.args, "data_source", {"save": rollout_id, "offset": self.offset})

    def load(self, rollout_id=None):
        return None

    def __len__(self):
        return len(self.rows)


# ------------------------------------------------------------------ custom generates
def _answer(sample: Sample, text: str) -> None:
    ids = [ord(c) % 250 for c in text]
    sample.tokens = list(sample.tokens or [1, 2, 3]) + ids
    sample.response = text
    sample.response_length = len(ids)


async def generate_multi_turn(args, sample, sampling_params, max_turns=3):
    """A custom generate whose 4th parameter is not `evaluation` (slime passes it only by name)."""
    _answer(sample, f"turns={max_turns} answer {sample.label}")
    sample.metadata["max_turns"] = max_turns
    sample.status = Sample.Status.COMPLETED
    return sample


async def generate_with_evaluation(args, sample, sampling_params, evaluation=False):
    """A custom generate naming `evaluation`: records the flag it got."""
    _answer(sample, f"eval={evaluation} answer {sample.label}")
    sample.metadata["evaluation"] = evaluation
    sample.status = Sample.Status.COMPLETED
    return sample


def generate_sync(args, sample, sampling_params):
    """A synchronous custom generate (slime wants async; we accept it)."""
    _answer(sample, f"sync answer {sample.label}")
    sample.metadata["sync"] = True
    sample.status = Sample.Status.TRUNCATED if sample.index % 2 else Sample.Status.COMPLETED
    return sample


# ------------------------------------------------------------------ slime's rm_hub dispatcher, stand-in
def _last_number(text: str) -> str | None:
    found = re.findall(r"-?\d+", text or "")
    return found[-1] if found else None


async def async_rm(args, sample: Sample, **kwargs):
    """Same signature and dispatch order as slime's `rm_hub.async_rm`: the sample's
    custom_rm_path, then args.custom_rm_path, then rm_type (the sample's metadata first)."""
    if sample.custom_rm_path:
        rm_function = load_function(sample.custom_rm_path)
        return await rm_function(args, sample, **kwargs)

    if args.custom_rm_path is not None:
        rm_function = load_function(args.custom_rm_path)
        return await rm_function(args, sample, **kwargs)

    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    rm_type = (metadata.get("rm_type") or args.rm_type or "").strip()
    response = sample.response
    if rm_type.startswith("boxed_"):
        boxed = re.findall(r"\\boxed\{([^{}]*)\}", response or "")
        response = boxed[-1] if boxed else ""
        rm_type = rm_type[len("boxed_"):]
    if rm_type == "math":
        return 1 if _last_number(response) == str(sample.label).strip() else 0
    if rm_type:
        raise NotImplementedError(f"Rule-based RM for {rm_type} is not implemented.")
    raise NotImplementedError("Rule-based RM type is not specified.")


# ------------------------------------------------------------------ a plugin reading an unset slime arg
def rollout_needing_loss_mask_type(args, rollout_id, data_source, evaluation=False):
    """Reads `args.loss_mask_type`, which this config does not define."""
    return [[Sample(index=0, tokens=[1], response_length=0)]] if args.loss_mask_type else []
