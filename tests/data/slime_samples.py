"""slime-shaped samples with every field set, a stand-in for slime's own `Sample.Status`, and a
field-by-field comparison (shared by the Sample, checkpoint, dump and replay tests)."""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

from pipeline import Sample


class SlimeStatus(Enum):
    """Exactly slime's `Sample.Status` (slime/utils/types.py): a plain Enum, no str mixin."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


def every_field(i: int) -> dict[str, Any]:
    """A value for every Sample field, in field order, none of them the default."""
    return {
        "group_index": i // 2, "index": i, "rollout_id": 1000 + i,
        "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
        "tokens": [5, 6, 7, 40 + i, 41, 42],
        "multimodal_inputs": {"images": [f"img{i}.png"]},
        "multimodal_train_inputs": {"pixel_values": [[0.5, 0.25], [1.0, -2.0]]},
        "multimodal_train_input_id": f"mm-{i}",
        "apply_chat_template_kwargs": {"enable_thinking": bool(i % 2)},
        "response": f"answer {i + 1}", "response_length": 3, "label": str(i + 1),
        "reward": {"acc": 1.0, "fmt": 0.1 * i},
        "loss_mask": [1, 0, 1],
        "weight_versions": ["3", "4"],
        "rollout_log_probs": [-0.1, 0.0, -2.5e-8 * (i + 1)],
        "rollout_top_p_token_ids": [40 + i, 9, 41, 42, 77],
        "rollout_top_p_token_offsets": [0, 2, 2, 5],
        "rollout_routed_experts": [[[i, 1], [2, 3]], [[4, 5], [6, 7]], [[0, 2], [1, 3]], [[7, 6], [5, 4]],
                                   [[1, 1], [2, 2]]],
        "remove_sample": True,
        "teacher_log_probs": [-0.3, -1e-300, -7.0],
        "status": Sample.Status.TRUNCATED,
        "metadata": {"start_rollout_id": 2, "rm_type": "math", "tools": [{"name": "calc"}]},
        "generate_function_path": "mypkg.gen.generate",
        "custom_rm_path": "mypkg.rm.reward",
        "train_metadata": {"loss": "ppo", "weight": 0.5},
        "session_id": f"session-{i}",
        "non_generation_time": 0.125 + i,
        "spec_info": Sample.SpecInfo(spec_accept_token_num=5 + i, spec_draft_token_num=8, spec_verify_ct=3,
                                     completion_token_num=6),
        "prefix_cache_info": Sample.PrefixCacheInfo(cached_tokens=4, total_prompt_tokens=6 + i),
    }


def full_sample(i: int) -> Sample:
    """A Sample with every field set (by keyword) and one extra attribute."""
    s = Sample(**every_field(i))
    s.extra_note = {"kept": i}  # an attribute that is not a field (from_dict keeps them)
    return s


def assert_same_sample(got: Any, want: Any) -> None:
    """Every field equal and of the same kind (status our enum member, records our classes),
    extra attributes too."""
    assert type(got) is Sample, type(got)
    for f in dataclasses.fields(Sample):
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert a == b, f"{f.name}: {a!r} != {b!r}"
        assert type(a) is type(b), f"{f.name}: {type(a).__name__} != {type(b).__name__}"
    assert got.status is Sample.Status(want.status)
    extras = {k: v for k, v in vars(want).items() if k not in Sample.__dataclass_fields__}
    assert {k: v for k, v in vars(got).items() if k not in Sample.__dataclass_fields__} == extras
