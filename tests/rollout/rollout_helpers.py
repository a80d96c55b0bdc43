"""Helpers shared by the rollout tests (a unique module name: test dirs share sys.path)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

_BOXED = re.compile(r"\\boxed\{([^}]*)\}")


class BoxedReward:
    """Minimal reward with the dispatcher's shape: 1.0 when the last \\boxed{} equals the label."""

    def __init__(self) -> None:
        self.calls = 0

    async def score(self, args: Any, samples: list[Any]) -> list[float]:
        self.calls += 1
        out = []
        for s in samples:
            found = _BOXED.findall(s.response)
            out.append(1.0 if found and found[-1].strip() == str(s.label) else 0.0)
        return out


def write_prompts(path: Path, n: int, seed: int = 0) -> Path:
    """`n` rows {"input": "What is a + b?", "label": "a+b"}."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randint(1, 50), rng.randint(1, 50)
            f.write(json.dumps({"input": f"What is {a} + {b}?", "label": str(a + b)}) + "\n")
    return path


def make_args(**over: Any) -> SimpleNamespace:
    """slime-named args with the run config's defaults (conf/config.yaml) plus overrides."""
    base = dict(
        rollout_batch_size=4, n_samples_per_prompt=2, over_sampling_batch_size=None,
        rollout_temperature=1.0, rollout_top_p=1.0, rollout_top_k=-1, rollout_max_response_len=256,
        rollout_stop=[], rollout_stop_token_ids=[], reward_key=None, eval_reward_key=None,
        partial_rollout=False, mask_offpolicy_in_partial_rollout=False, n_samples_per_eval_prompt=1,
        input_key="input", label_key="label", seed=1234, eval_prompt_data=None,
    )
    base.update(over)
    if base["over_sampling_batch_size"] is None:
        base["over_sampling_batch_size"] = base["rollout_batch_size"]
    return SimpleNamespace(**base)
