"""Deterministic mode in-process: batches, tokens and the buffer do not depend on completion order."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from pipeline.data.sources import BufferedDataSource
from pipeline.engines.base import GenerationRequest, GenerationResult
from pipeline.engines.scripted import ByteTokenizer, ScriptedEngine
from pipeline.rollout.dynamic_filters import check_reward_nonzero_std
from pipeline.rollout.engine_rollout import EngineRollout
from pipeline.rollout.sample_generate import GenContext, continuation_seed, default_generate
from pipeline.samples.sample import Sample
from rollout_helpers import BoxedReward, make_args, write_prompts

pytestmark = pytest.mark.timeout(60)


class OrderSpy(ScriptedEngine):
    """Scripted engine with seeded jitter that records the order in which requests finish."""

    def __init__(self, jitter_seed: int | None, **kw: Any) -> None:
        super().__init__(token_delay=0.0005, token_delay_jitter=0.002 if jitter_seed is not None else 0.0, **kw)
        self._jitter_rng = random.Random(jitter_seed)
        self.finished: list[int | None] = []
        self.seeds: list[int | None] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.seeds.append(request.sampling.seed)
        out = await super().generate(request)
        self.finished.append(request.sampling.seed)
        return out


def _run(prompts: Path, engine: OrderSpy, rollouts: int = 4, **kw: Any) -> list[Any]:
    args = make_args(rollout_batch_size=3, over_sampling_batch_size=5, n_samples_per_prompt=3,
                     partial_rollout=True, rollout_max_response_len=64)
    source = BufferedDataSource(prompt_data=str(prompts), n_samples_per_prompt=3, shuffle=True, label_key="label", apply_chat_template=False)
    rollout = EngineRollout(engine=engine, reward=BoxedReward(), tokenizer=ByteTokenizer(),
                            dynamic_filter=check_reward_nonzero_std, deterministic=True, seed=7,
                            progress=False, summary=False, **kw)
    record = []
    for r in range(rollouts):
        out = rollout(args, r, source)
        record.append(([[s.to_dict() for s in g] for g in out.samples],
                       [[s.to_dict() for s in g] for g in source.buffer], source.state_dict()["sample_group_index"]))
    return record


def test_batches_tokens_and_buffer_ignore_completion_order(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 12)
    engines = [OrderSpy(None), OrderSpy(1), OrderSpy(2), OrderSpy(3)]
    runs = [_run(prompts, e, max_concurrency=4 if i == 3 else None) for i, e in enumerate(engines)]
    assert len({tuple(e.finished) for e in engines}) > 1, "the jitter did not change the completion order"
    for other in runs[1:]:
        assert other == runs[0]
    # the dynamic filter dropped something, and surplus / aborted groups went back to the buffer
    assert any(buf for _, buf, _ in runs[0])
    assert all(s["status"] == "pending" and s["response_length"] == 0 for _, buf, _ in runs[0] for g in buf for s in g)


def test_groups_are_admitted_in_index_order(tmp_path):
    """Groups queued in the buffer in reverse index order are still admitted by index."""
    prompts = write_prompts(tmp_path / "p.jsonl", 12)
    source = BufferedDataSource(prompt_data=str(prompts), n_samples_per_prompt=2, shuffle=False, label_key="label", apply_chat_template=False)
    source.add_samples(list(reversed(source.get_samples(6))))

    def drop_odd(args: Any, samples: list[Sample], **kw: Any) -> bool:
        return samples[0].group_index % 2 == 0

    rollout = EngineRollout(engine=OrderSpy(5), reward=BoxedReward(), tokenizer=ByteTokenizer(),
                            dynamic_filter=drop_odd, deterministic=True, progress=False, summary=False)
    args = make_args(rollout_batch_size=2, over_sampling_batch_size=6, n_samples_per_prompt=2, partial_rollout=True)
    out = rollout(args, 0, source)
    assert [g[0].group_index for g in out.samples] == [0, 2]
    assert [g[0].group_index for g in source.buffer] == [3, 4, 5]  # 1 was dropped; the rest in order


def test_a_continued_sample_continues_the_same_way():
    """A partial sample continues with a seed from its own seed and tokens: same prefix, same
    continuation; the seed differs from the fresh one."""
    tok = ByteTokenizer()
    engine = ScriptedEngine(max_filler=6)
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 64, "seed": 99}

    def partial() -> Sample:
        s = Sample(index=0, group_index=0, prompt="What is 2 + 3?", tokens=tok.encode("What is 2 + 3?"))
        s.append_response_tokens(make_args(), tokens=tok.encode("Hmm. Ok"), log_probs=None,
                                 meta_info={"finish_reason": {"type": "abort"}}, text="Hmm. Ok")
        return s

    outs = []
    for _ in range(2):
        s = partial()
        assert s.status == Sample.Status.ABORTED
        asyncio.run(default_generate(GenContext(engine=engine, tokenizer=tok, rollout_id=0), make_args(), s, params))
        outs.append(list(s.tokens))
    assert outs[0] == outs[1] and len(outs[0]) > len(tok.encode("What is 2 + 3?Hmm. Ok"))
    assert continuation_seed(99, tok.encode("Hmm. Ok")) not in (99, continuation_seed(99, tok.encode("Hmm.")))
