"""EngineEval: output shape, reward keys, truncation, pass@k, delegation from EngineRollout."""

from __future__ import annotations

import math
from typing import Any

import pytest

from pipeline.engines.scripted import ScriptedEngine
from pipeline.rollout.contracts import RolloutFnEvalOutput
from pipeline.rollout.eval import EngineEval, pass_at_k

from rollout_helpers import BoxedReward, make_args, write_prompts

pytestmark = pytest.mark.timeout(60)


def test_pass_at_k_estimator():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_eval_output_and_metrics(tmp_path, tokenizer, caplog):
    path = write_prompts(tmp_path / "eval.jsonl", 6, seed=7)
    # the second dataset uses the earlier spelling of the prompt file key: read, with a warning
    ev = EngineEval(engine=ScriptedEngine(), reward=BoxedReward(), tokenizer=tokenizer, progress=False,
                    datasets=[{"name": "arith", "prompt_data": str(path), "label_key": "label",
                               "n_samples_per_eval_prompt": 4},
                              {"name": "short", "path": str(path), "label_key": "label",
                               "max_response_len": 8}])
    assert "eval.datasets[1].path is deprecated: the prompt file key is prompt_data" in caplog.text
    assert "eval.datasets[0].path" not in caplog.text
    out = ev(make_args(), 3, None)
    assert isinstance(out, RolloutFnEvalOutput)
    d = out.data["arith"]
    assert len(d["rewards"]) == len(d["truncated"]) == len(d["samples"]) == 24
    idx = [s.index for s in d["samples"]]
    assert idx == sorted(idx)
    m = out.metrics
    assert m["eval/arith"] == pytest.approx(sum(d["rewards"]) / 24)
    assert 0 < m["eval/arith"] < 1
    per_prompt: dict[int, list[float]] = {}
    for s, r in zip(d["samples"], d["rewards"]):
        per_prompt.setdefault(s.group_index, []).append(r)
    for k in (1, 2, 4):
        want = sum(pass_at_k(4, int(sum(v)), k) for v in per_prompt.values()) / 6
        assert m[f"eval/arith-pass@{k}"] == pytest.approx(want)
    assert m["eval/arith-pass@4"] >= m["eval/arith-pass@1"]
    assert m["eval/arith-truncated_ratio"] == 0.0
    short = out.data["short"]
    assert all(short["truncated"]) and m["eval/short-truncated_ratio"] == 1.0
    assert all(s.response_length == 8 for s in short["samples"])


class DictReward(BoxedReward):
    async def score(self, args: Any, samples: list) -> list:
        return [{"acc": r, "len": s.response_length} for s, r in zip(samples, await super().score(args, samples))]


def test_eval_reward_key_and_rollout_delegation(tmp_path, make_rollout):
    path = write_prompts(tmp_path / "eval.jsonl", 3, seed=1)
    args = make_args(eval_prompt_data=["e", str(path)], reward_key="len", eval_reward_key="acc",
                     n_samples_per_eval_prompt=2)
    out = make_rollout(reward=DictReward())(args, 0, None, evaluation=True)
    rewards = out.data["e"]["rewards"]
    assert len(rewards) == 6 and set(rewards) <= {0.0, 1.0}
    assert "eval/e-pass@2" in out.metrics and not math.isnan(out.metrics["eval/e"])


def test_eval_needs_datasets(make_rollout):
    with pytest.raises(ValueError, match="eval"):
        make_rollout()(make_args(eval_prompt_data=None), 0, None, evaluation=True)
    with pytest.raises(ValueError, match="unknown keys"):
        EngineEval(engine=ScriptedEngine(), datasets=[{"name": "x", "prompt_data": "p", "temprature": 1}])
