"""A slime rollout function for a buffer-only data source (slime's --disable-rollout-global-dataset),
written exactly in slime's signature and style: it gets empty samples, writes the prompt itself,
fills every Sample field (slime's own `Sample.Status` enum included) and puts one unfinished
group back in the buffer each rollout. Used by tests/test_cli_slime_data.py."""

from __future__ import annotations

import base64
from enum import Enum
from types import SimpleNamespace
from typing import Any

from pipeline.samples.sample import Sample


class Status(Enum):  # stands in for slime.utils.types.Sample.Status (a plain Enum)
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


# the speculative-decoding counters are folded in only under slime's flag (as in slime)
_SPECULATIVE = SimpleNamespace(sglang_speculative_algorithm="EAGLE")


def _int32(values: list[int]) -> str:
    """An SGLang meta_info array: base64 of little-endian int32."""
    return base64.b64encode(b"".join(v.to_bytes(4, "little", signed=True) for v in values)).decode()


def fill(sample: Sample, rollout_id: int) -> None:
    """Every field of `sample` from its index (deterministic), grown the way slime grows it."""
    i = sample.index
    sample.rollout_id = 5000 + i
    sample.prompt = [{"role": "user", "content": f"fixed question {sample.group_index}"}]
    sample.tokens = [11, 12, 13 + i % 7]
    sample.multimodal_inputs = {"images": [f"img{i}.png"]}
    sample.multimodal_train_inputs = {"pixel_values": [[0.25, -1.5]]}
    sample.multimodal_train_input_id = f"mm{i}"
    sample.apply_chat_template_kwargs = {"enable_thinking": False}
    sample.label = str(i)
    sample.metadata = {"source": "agent", "round_number": rollout_id}
    sample.generate_function_path = "mypkg.generate"
    sample.custom_rm_path = "mypkg.reward"
    sample.train_metadata = {"loss": "ppo"}
    sample.session_id = f"s{i}"
    sample.non_generation_time = 0.5 + i
    sample.append_response_tokens(args=_SPECULATIVE, tokens=[20 + i % 5, 21], log_probs=[-0.25, -1.0 / (i + 3)],
                                  text="the answer", meta_info={
                                      "top_p_token_ids": _int32([20 + i % 5, 7, 21]),
                                      "top_p_token_offsets": _int32([0, 2, 3]),
                                      "finish_reason": {"type": "length"}, "weight_version": str(rollout_id),
                                      "cached_tokens": 2, "prompt_tokens": 3,
                                      "spec_accept_token_num": 1, "spec_draft_token_num": 2, "spec_verify_ct": 1,
                                      "completion_tokens": 2})
    sample.append_response_tokens(tokens=[99], trainable=False, text=" [tool]")
    sample.rollout_routed_experts = [[[i % 4, 1]], [[2, 3]], [[0, 1]], [[1, 2]], [[3, 0]]]
    sample.teacher_log_probs = [-0.5, -0.125, 0.0]
    sample.reward = float(i % 2)
    sample.status = Status.COMPLETED if i % 3 else Status.TRUNCATED  # slime's own enum


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """slime rollout function: rollout_batch_size groups out, one extra unfinished group back
    into the buffer (served first next time, already filled)."""
    groups = data_source.get_samples(args.rollout_batch_size + 1)
    for group in groups:
        for sample in group:
            if not sample.response_length:
                fill(sample, rollout_id)
    data_source.add_samples(groups[-1:])
    return groups[:-1]


def expected(index: int, group_index: int, rollout_id: int) -> Any:
    """The sample `fill` makes for an empty one with these indices."""
    s = Sample(group_index=group_index, index=index)
    fill(s, rollout_id)
    return s


async def generate_with_tool_turn(args, sample, sampling_params):
    """slime custom generate (search-r1 style): one model turn, a tool answer the model did not
    write (loss mask 0), and the status set with slime's own enum."""
    from pipeline.rollout.sample_generate import generate

    sample = await generate(args, sample, sampling_params)
    sample.append_response_tokens(tokens=[32, 33], trainable=False, text=" [tool: ok]")
    sample.status = Status.COMPLETED
    return sample
