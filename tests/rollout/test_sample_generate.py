"""The per-sample pieces of the default generate (pipeline/rollout/sample_generate.py): the
sampling params read from the run args and the reset of a sample to a fresh prompt."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.engines.base import GenerationResult, SamplingParams
from pipeline.engines.scripted import ByteTokenizer
from pipeline.rollout.sample_generate import (
    GenContext, continuation_seed, default_generate, reset_sample, sampling_params_from_args, to_engine_params,
)
from pipeline.samples.sample import Sample

pytestmark = pytest.mark.timeout(30)


def test_sampling_params_carry_every_rollout_arg_and_default_the_stops():
    args = SimpleNamespace(rollout_temperature=0.7, rollout_top_p=0.9, rollout_top_k=20, rollout_max_response_len=64,
                           rollout_stop=["</s>", "\n\n"], rollout_stop_token_ids=[2])
    params = sampling_params_from_args(args)
    assert params == {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 64, "stop": ["</s>", "\n\n"],
                      "stop_token_ids": [2], "skip_special_tokens": True, "no_stop_trim": True,
                      "spaces_between_special_tokens": False}
    assert to_engine_params(params, seed=5) == SamplingParams(
        temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=64, stop=("</s>", "\n\n"), stop_token_ids=(2,), seed=5)
    unset = to_engine_params({**params, "top_k": None, "stop": None, "stop_token_ids": None, "seed": 9}, seed=5)
    assert (unset.top_k, unset.stop, unset.stop_token_ids, unset.seed) == (-1, (), (), 9)  # no cut; params' seed wins
    bare = SimpleNamespace(rollout_temperature=1.0, rollout_top_p=1.0, rollout_top_k=-1, rollout_max_response_len=8,
                           rollout_stop=None, rollout_stop_token_ids=None)
    assert sampling_params_from_args(bare)["stop"] == [] and sampling_params_from_args(bare)["stop_token_ids"] == []
    assert sampling_params_from_args(args, {"top_k": None, "max_new_tokens": 4})["max_new_tokens"] == 4


def test_reset_sample_gives_back_the_fresh_prompt():
    fresh = Sample(group_index=3, index=7, prompt="What is 1 + 1?", tokens=[1, 2, 3], label="2",
                   metadata={"source_name": "math"})
    sample = Sample(group_index=3, index=7, prompt="What is 1 + 1?", tokens=[1, 2, 3, 40, 41], label="2",
                    response="ab", response_length=2, loss_mask=[1, 0], rollout_log_probs=[-0.5, -1.0],
                    rollout_top_p_token_ids=[40, 41], rollout_top_p_token_offsets=[0, 1, 2],
                    rollout_routed_experts=[[1], [2]], teacher_log_probs=[-0.1, -0.2], reward=1.0,
                    weight_versions=["3"], status=Sample.Status.ABORTED,
                    metadata={"source_name": "math", "start_rollout_id": 4})
    reset_sample(sample)
    assert sample.to_dict() == fresh.to_dict()
    unstarted = Sample(tokens=[1, 2, 3])
    reset_sample(unstarted)  # nothing generated yet: the prompt tokens stay as they are
    assert unstarted.tokens == [1, 2, 3]


def test_default_generate_leaves_finished_samples_and_everything_after_the_abort_alone():
    class NoEngine:
        async def generate(self, request):
            raise AssertionError(f"unexpected request {request.request_id}")

    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 8}
    done = Sample(tokens=[1, 2, 5], response_length=1, status=Sample.Status.COMPLETED)
    ctx = GenContext(engine=NoEngine(), tokenizer=None, rollout_id=0)
    assert asyncio.run(default_generate(ctx, SimpleNamespace(), done, params)) is done
    waiting = Sample(tokens=[1, 2])  # not sent before the batch filled: untouched
    ctx.aborted = True
    assert asyncio.run(default_generate(ctx, SimpleNamespace(), waiting, params)) is waiting
    assert waiting.response_length == 0 and waiting.status == Sample.Status.PENDING and ctx.requests == 0


class RecordingEngine:
    """Answers every request with two tokens and records what it was asked."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def generate(self, request):
        self.requests.append(request)
        return GenerationResult(request.request_id, [9, 9], "xx", "stop", None)


PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 6}


def _generate(sample: Sample, args: Any = None, **params: Any) -> tuple[Sample, Any]:
    engine = RecordingEngine()
    ctx = GenContext(engine=engine, tokenizer=ByteTokenizer(), rollout_id=0)
    args = args or SimpleNamespace(mask_offpolicy_in_partial_rollout=False)
    asyncio.run(default_generate(ctx, args, sample, {**PARAMS, **params}))
    return sample, (engine.requests[0] if engine.requests else None)


def test_default_generate_encodes_a_bare_prompt_with_its_tools():
    tok = ByteTokenizer()
    messages = [{"role": "user", "content": "hi"}]
    sample, request = _generate(Sample(prompt=messages, metadata={"tools": [{"name": "calc"}]}))
    prompt_ids = tok.encode(tok.apply_chat_template(messages, tools=[{"name": "calc"}]))
    assert request.input_ids == prompt_ids and sample.tokens == prompt_ids + [9, 9]
    sample, request = _generate(Sample(prompt="What is 1 + 1?"))
    assert request.input_ids == tok.encode("What is 1 + 1?")


def test_default_generate_spends_only_the_remaining_budget():
    full = Sample(tokens=[1, 2, 7, 7, 7, 7, 7, 7], response_length=6, status=Sample.Status.ABORTED)
    sample, request = _generate(full)  # nothing left to generate: truncated, no request
    assert request is None and sample.status == Sample.Status.TRUNCATED and sample.response_length == 6
    sample, request = _generate(Sample(tokens=[1, 2, 7, 7, 7, 7, 7], response_length=5, status="aborted"))
    assert request.sampling.max_new_tokens == 1


def test_a_continued_sample_gets_a_seed_from_its_own_tokens_and_masks_them_when_asked():
    def partial() -> Sample:  # one response token so far, from an earlier weight version
        return Sample(tokens=[1, 2, 7], response_length=1, loss_mask=[1], status=Sample.Status.ABORTED)

    sample, request = _generate(partial(), SimpleNamespace(mask_offpolicy_in_partial_rollout=True), seed=11)
    assert request.sampling.seed == continuation_seed(11, [7]) and request.input_ids == [1, 2, 7]
    assert sample.loss_mask == [0, 1, 1] and sample.response_length == 3
    sample, request = _generate(partial(), seed=None)  # no seed: the engine picks
    assert request.sampling.seed is None and sample.loss_mask == [1, 1, 1]  # unmasked when not asked


class AnsweringEngine:
    """Answers every request with three tokens, the given log-probs and weight versions."""

    def __init__(self, log_probs=None, versions=None, **attrs: Any) -> None:
        self.log_probs, self.versions, self.requests = log_probs, versions, []
        self.__dict__.update(attrs)

    async def generate(self, request):
        self.requests.append(request)
        return GenerationResult(request.request_id, [9, 9, 9], "xyz", "stop", self.log_probs, self.versions)


def _answer(engine: AnsweringEngine, sample: Sample, args: Any = None, ctx: GenContext | None = None,
            tokenizer: Any = None) -> Sample:
    ctx = ctx or GenContext(engine=engine, tokenizer=tokenizer or ByteTokenizer(), rollout_id=0)
    args = args or SimpleNamespace(mask_offpolicy_in_partial_rollout=False)
    asyncio.run(default_generate(ctx, args, sample, dict(PARAMS)))
    return sample


def test_weight_versions_come_from_the_engines_answer_or_else_the_engine():
    # one version per token from the answer (the last one is the call's)
    assert _answer(AnsweringEngine(versions=[4, 5, 6]), Sample(tokens=[1, 2])).weight_versions == ["4", "5", "6"]
    sample = _answer(AnsweringEngine(versions=[4, 4, 6]), Sample(tokens=[1, 2]))
    assert sample.weight_versions == ["4", "6"] and sample.metadata["weight_version_runs"] == [[4, 2], [6, 1]]
    # no versions in the answer: the version the engine serves, 0 for one that cannot update its weights
    assert _answer(AnsweringEngine(weight_version=7), Sample(tokens=[1, 2])).weight_versions == ["7"]
    assert _answer(AnsweringEngine(), Sample(tokens=[1, 2])).weight_versions == ["0"]


def test_the_session_id_reaches_the_engine():
    engine = AnsweringEngine()
    _answer(engine, Sample(tokens=[1, 2], session_id="conv-3"))
    assert engine.requests[0].session_id == "conv-3"


def test_a_continued_sample_keeps_its_log_probs_consistent():
    # earlier tokens had no log-probs: the new ones are dropped too (no error)
    sample = _answer(AnsweringEngine(log_probs=[-0.1, -0.2, -0.3]),
                     Sample(tokens=[1, 2, 7], response_length=1, status=Sample.Status.ABORTED))
    assert sample.response_length == 4 and sample.rollout_log_probs is None
    # earlier tokens had them: the new ones are appended
    sample = _answer(AnsweringEngine(log_probs=[-0.1, -0.2, -0.3]),
                     Sample(tokens=[1, 2, 7], response_length=1, rollout_log_probs=[-0.5],
                            status=Sample.Status.ABORTED))
    assert sample.rollout_log_probs == [-0.5, -0.1, -0.2, -0.3]


class DecodeRecorder(ByteTokenizer):
    def __init__(self) -> None:
        super().__init__()
        self.decodes: list[dict] = []

    def decode(self, ids, skip_special_tokens=True, **kw):
        self.decodes.append(dict(ids=list(ids), skip_special_tokens=skip_special_tokens))
        return super().decode(ids, skip_special_tokens=skip_special_tokens, **kw)


def test_a_continued_response_is_decoded_whole_and_a_fresh_one_is_the_engines_text():
    tok = DecodeRecorder()
    fresh = _answer(AnsweringEngine(), Sample(tokens=[1, 2]), tokenizer=tok)
    assert fresh.response == "xyz" and tok.decodes == []
    continued = _answer(AnsweringEngine(), Sample(tokens=[1, 2, 65], response="A", response_length=1,
                                                  status=Sample.Status.ABORTED), tokenizer=tok)
    # the whole response (earlier token + new ones) decoded, special tokens skipped as the engine does
    assert tok.decodes == [dict(ids=[65, 9, 9, 9], skip_special_tokens=True)]
    assert continued.response == ByteTokenizer().decode([65, 9, 9, 9])
    # without a tokenizer the texts are joined
    ctx = GenContext(engine=AnsweringEngine(), tokenizer=None, rollout_id=0)
    joined = _answer(ctx.engine, Sample(tokens=[1, 2, 65], response="A", response_length=1,
                                        status=Sample.Status.ABORTED), ctx=ctx)
    assert joined.response == "Axyz"


def test_masked_off_policy_tokens_are_counted_over_the_rollout():
    # the weights change during each request: its first token (version 0) is older than the newest (1)
    ctx = GenContext(engine=AnsweringEngine(versions=[0, 1, 1]), tokenizer=ByteTokenizer(), rollout_id=0)
    args = SimpleNamespace(mask_offpolicy_in_partial_rollout=True)
    for _ in range(2):
        sample = _answer(ctx.engine, Sample(tokens=[1, 2]), args=args, ctx=ctx)
        assert sample.loss_mask == [0, 1, 1]
    assert ctx.offpolicy_tokens_masked == 2
