"""A rollout in the shape of slime's `slime/rollout/sft_rollout.py`: module-level caches, the
tokenizer loaded with `from_pretrained(args.hf_checkpoint, trust_remote_code=True)`, a loss-mask
generator chosen by `args.loss_mask_type` (a slime arg this config does not have: set it with
`+loss_mask_type=...`), one sample per group, reward 0. The mask generator is our own small one."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

TOKENIZER = None
MASK_GENERATOR = None


@dataclass
class RolloutFnTrainOutput:  # stands in for slime.rollout.base_types.RolloutFnTrainOutput
    samples: list
    metrics: dict | None = None


class PrefixMaskGenerator:
    """Token ids of a rendered conversation and a mask that is 1 on the assistant turns."""

    def __init__(self, tokenizer: Any, tokenizer_type: str) -> None:
        if tokenizer_type != "prefix":
            raise ValueError(f"unknown loss_mask_type {tokenizer_type!r}")
        self.tokenizer = tokenizer

    def get_loss_mask(self, messages: list[dict], tools: Any = None) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        mask: list[int] = []
        for i, message in enumerate(messages):
            text = self.tokenizer.apply_chat_template(messages[: i + 1], tokenize=False, tools=tools)
            new = self.tokenizer(text, add_special_tokens=False)["input_ids"][len(ids):]
            ids += new
            mask += [1 if message["role"] == "assistant" else 0] * len(new)
        return ids, mask

    def get_response_lengths(self, loss_masks: list[list[int]]) -> list[int]:
        return [len(m) - m.index(1) if 1 in m else 0 for m in loss_masks]


def generate_rollout(args, rollout_id, data_buffer, evaluation=False):
    """slime's sft_rollout.generate_rollout, step for step."""
    assert not evaluation
    assert args.rollout_global_dataset

    global TOKENIZER, MASK_GENERATOR
    if TOKENIZER is None:
        from transformers import AutoTokenizer

        TOKENIZER = AutoTokenizer.from_pretrained(args.hf_checkpoint, trust_remote_code=True)
        with open(os.path.join(args.hook_log_dir, "sft.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps({"hf_checkpoint": args.hf_checkpoint}) + "\n")
    if MASK_GENERATOR is None:
        MASK_GENERATOR = PrefixMaskGenerator(TOKENIZER, tokenizer_type=args.loss_mask_type)

    samples = data_buffer.get_samples(args.rollout_batch_size)
    for group in samples:
        (sample,) = group
        token_ids, loss_mask = MASK_GENERATOR.get_loss_mask(sample.prompt, tools=sample.metadata.get("tools"))
        response_length = MASK_GENERATOR.get_response_lengths([loss_mask])[0]
        sample.tokens = token_ids
        sample.response_length = response_length
        sample.reward = 0
        sample.loss_mask = loss_mask[-response_length:]
    return RolloutFnTrainOutput(samples=samples)
