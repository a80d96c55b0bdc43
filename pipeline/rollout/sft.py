"""SFT as a rollout: each row's message list becomes tokens plus a loss mask (docs/contracts.md §8).

Like slime's `sft_rollout.generate_rollout`: the mask is 1 on assistant content tokens, 0 on
system/user/tool turns and on the assistant header the chat template adds; reward is 0.
The mask is found by rendering growing prefixes of the conversation with the tokenizer's chat
template, so any template whose renders are prefixes of each other works.
"""

from __future__ import annotations

import logging
from typing import Any

from pipeline.rollout.contracts import RolloutFnTrainOutput
from pipeline.samples.sample import Sample

__all__ = ["SftRollout", "tokens_and_loss_mask"]

logger = logging.getLogger(__name__)


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, gen: bool) -> str:
    if not messages and not gen:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, tools=tools)


def tokens_and_loss_mask(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and a per-token mask (1 = assistant content)."""
    tokens: list[int] = []
    mask: list[int] = []
    done = ""
    for i, message in enumerate(messages):
        pieces: list[tuple[str, int]] = []
        if message.get("role") == "assistant":
            with_header = _render(tokenizer, messages[:i], tools, gen=True)
            if not with_header.startswith(done):
                raise ValueError(f"chat template: the generation prompt before message {i} does not extend the "
                                 f"conversation so far; cannot place the loss mask")
            pieces.append((with_header[len(done):], 0))
            done = with_header
        text = _render(tokenizer, messages[: i + 1], tools, gen=False)
        if not text.startswith(done):
            raise ValueError(f"chat template: the render up to message {i} does not extend the render before it; "
                             f"cannot place the loss mask")
        pieces.append((text[len(done):], 1 if message.get("role") == "assistant" else 0))
        done = text
        for piece, bit in pieces:
            if piece:
                ids = tokenizer.encode(piece, add_special_tokens=False)
                tokens.extend(ids)
                mask.extend([bit] * len(ids))
    return tokens, mask


class SftRollout:
    """`rollout(args, rollout_id, data_source)`: rollout_batch_size rows as tokens + loss masks."""

    def __init__(self, *, tokenizer: Any) -> None:
        if tokenizer is None or not hasattr(tokenizer, "apply_chat_template"):
            raise ValueError("rollout=sft needs a tokenizer with a chat template (from the engine group)")
        self.tokenizer = tokenizer

    def __call__(self, args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> RolloutFnTrainOutput:
        """Fetch rollout_batch_size groups and fill tokens, response_length, loss_mask, reward=0."""
        if evaluation:
            raise ValueError("rollout=sft has no eval branch; use eval=none")
        groups = data_source.get_samples(int(args.rollout_batch_size))
        for group in groups:
            for sample in group:
                self._fill(sample)
        return RolloutFnTrainOutput(samples=groups)

    def _fill(self, sample: Sample) -> None:
        messages = sample.prompt
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError(
                f"rollout=sft: sample {sample.index} prompt is {type(messages).__name__}; expected a message "
                f"list [{{'role': ..., 'content': ...}}] (set data_source.input_key to the messages column)")
        tokens, mask = tokens_and_loss_mask(self.tokenizer, messages, (sample.metadata or {}).get("tools"))
        if 1 not in mask:
            raise ValueError(f"rollout=sft: sample {sample.index} has no assistant message to train on")
        response_length = len(mask) - mask.index(1)
        sample.tokens = tokens
        sample.response_length = response_length
        sample.loss_mask = mask[-response_length:]
        sample.response = self.tokenizer.decode(tokens[-response_length:])
        sample.reward = 0
        sample.status = Sample.Status.COMPLETED
