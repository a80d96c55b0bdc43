"""One train rollout's per-item and per-fetch plumbing (pipeline/rollout/train_run.py) with the scripted
engine: sample hooks (who gets them, with what), custom generate bookkeeping (originals, fan-out
tokens), per-sample rewards and progress, what the over-sampler and buffer filters are told, and
the groups the engine aborts before the batch is full."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.engines.base import GenerationRequest, GenerationResult
from pipeline.engines.scripted import ScriptedEngine
from pipeline.rollout.leftover_groups import Flight
from pipeline.rollout.over_sampling import OverSampler
from pipeline.rollout.sample_generate import bind
from pipeline.rollout.sample_hooks import SampleHooks
from pipeline.rollout.train_run import TrainRun
from pipeline.samples.sample import Sample
from pipeline.samples.versions import serving_version

from rollout_helpers import BoxedReward, make_args

pytestmark = pytest.mark.timeout(60)


class HookRecorder:
    """A rollout sample hook recording what it got."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, args: Any, sample: Sample, *, rollout_id: int, evaluation: bool) -> None:
        self.calls.append(dict(args=args, index=sample.index, response_length=sample.response_length,
                               rollout_id=rollout_id, evaluation=evaluation, sample=sample))


def test_sample_hooks_see_every_generated_sample_with_the_run_args_and_id_and_never_an_untouched_one(
        make_rollout, make_source):
    # one request at a time: when the batch fills, most samples were never sent; they get no hook
    hook = HookRecorder()
    args = make_args(rollout_batch_size=1, n_samples_per_prompt=2, over_sampling_batch_size=4, partial_rollout=True)
    src = make_source(n=2)
    rollout = make_rollout(ScriptedEngine(token_delay=0.001, max_filler=6), max_concurrency=1,
                           sample_hooks=SampleHooks([("tests.hook", hook)]), finish_surplus=False)
    out = rollout(args, 5, src)
    assert all(c["args"] is args and c["rollout_id"] == 5 and c["evaluation"] is False for c in hook.calls)
    hooked = {id(c["sample"]) for c in hook.calls}
    assert all(id(s) in hooked for g in out.samples for s in g)  # every kept sample
    # the buffered (continued) samples that got tokens were hooked too; none was hooked before it had any
    assert all(id(s) in hooked for g in src.buffer for s in g if s.response_length)
    assert all(c["response_length"] > 0 for c in hook.calls)
    assert len(hook.calls) < 8


def test_a_hook_replacing_a_sample_replaces_it_in_the_batch(make_rollout, make_source):
    def replace(args, sample):
        return Sample(index=sample.index, group_index=sample.group_index, prompt=sample.prompt, tokens=sample.tokens,
                      response=sample.response, response_length=sample.response_length,
                      rollout_log_probs=sample.rollout_log_probs, loss_mask=sample.loss_mask, status=sample.status,
                      metadata={"replaced": True})

    out = make_rollout(sample_hooks=SampleHooks([("tests.replace", replace)]))(
        make_args(rollout_batch_size=2), 0, make_source(buffered=False))
    assert all(s.metadata == {"replaced": True} and s.reward is not None for g in out.samples for s in g)


def run_for(make_rollout, make_source, engine=None, **rollout_kw) -> TrainRun:
    rollout = make_rollout(engine, **rollout_kw)
    return TrainRun(rollout, make_args(rollout_batch_size=1, n_samples_per_prompt=1), 7, make_source(buffered=False))


def run_item(run: TrainRun, flight: Flight, pos: int, sample: Sample) -> Any:
    async def go():
        bind(run.ctx)
        return await run._run_item(flight, pos, sample)
    return asyncio.run(go())


def fresh(make_source) -> Sample:
    return make_source(n=1, buffered=False).get_samples(1)[0][0]


def test_a_custom_generate_keeps_the_samples_original_for_a_restart(make_rollout, make_source):
    run = run_for(make_rollout, make_source, custom_generate_path="rollout_plugins.tagged_generate")
    sample = fresh(make_source)
    prompt = sample.prompt
    flight = Flight(0, [sample])
    out = run_item(run, flight, 0, sample)
    assert out is sample and sample.response_length > 0
    original = flight.originals[0]
    assert original is not sample and original.prompt == prompt and original.response_length == 0


def test_an_item_adds_its_output_response_tokens_less_those_it_had_before(make_rollout, make_source):
    run = run_for(make_rollout, make_source, custom_generate_path="rollout_plugins.fanout_generate")
    sample = fresh(make_source)
    flight = Flight(0, [sample], tokens=5)
    out = run_item(run, flight, 0, sample)
    assert isinstance(out, list) and len(out) == 2
    assert flight.tokens == 5 + sum(s.response_length for s in out)
    # a sample continued from an earlier rollout: its 2 earlier tokens are not counted again
    run = run_for(make_rollout, make_source)
    sample = fresh(make_source)
    run.ctx.tokenizer = run.engine_rollout.tokenizer
    sample.tokens = run.ctx.tokenizer.encode(sample.prompt) + [65, 66]
    sample.response, sample.response_length, sample.status = "AB", 2, Sample.Status.ABORTED
    flight = Flight(0, [sample], tokens=5)
    run_item(run, flight, 0, sample)
    assert sample.response_length > 2 and flight.tokens == 5 + sample.response_length - 2


class ArgsReward(BoxedReward):
    def __init__(self) -> None:
        super().__init__()
        self.args: list[Any] = []

    async def score(self, args, samples):
        self.args.append(args)
        return await super().score(args, samples)


class ProgressRecorder:
    def __init__(self) -> None:
        self.updates: list[tuple[Any, Any]] = []

    def update(self, samples, tokens):
        self.updates.append((samples, tokens))


def test_each_finished_sample_is_scored_with_the_run_args_and_counted_in_the_progress(make_rollout, make_source):
    reward = ArgsReward()
    run = run_for(make_rollout, make_source, reward=reward)
    run.progress = ProgressRecorder()
    sample = fresh(make_source)
    run_item(run, Flight(0, [sample]), 0, sample)
    assert sample.reward is not None and reward.args == [run.args]
    assert run.progress.updates == [(1, run.ctx.tokens_generated)] and run.ctx.tokens_generated > 0
    # nothing finished (the abort reached it before it was sent): no progress step, no score
    waiting = fresh(make_source)
    run.ctx.aborted = True
    run_item(run, Flight(1, [waiting]), 0, waiting)
    assert waiting.reward is None and len(run.progress.updates) == 1 and reward.args == [run.args]


def test_without_a_reward_samples_stay_unscored(make_rollout, make_source):
    run = run_for(make_rollout, make_source, reward=None)
    sample = fresh(make_source)
    run_item(run, Flight(0, [sample]), 0, sample)
    assert sample.response_length > 0 and sample.reward is None


def test_a_finished_sample_is_not_generated_or_hooked_again(make_rollout, make_source):
    hook = HookRecorder()
    run = run_for(make_rollout, make_source, sample_hooks=SampleHooks([("tests.hook", hook)]))
    sample = fresh(make_source)
    run_item(run, Flight(0, [sample]), 0, sample)
    assert len(hook.calls) == 1
    tokens = list(sample.tokens)
    run_item(run, Flight(1, [sample]), 0, sample)  # a finished (reused) sample
    assert len(hook.calls) == 1 and sample.tokens == tokens


class RecordingSampler(OverSampler):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.shortfalls: list[tuple] = []
        self.fetches: list[tuple] = []

    def shortfall(self, *a):
        out = super().shortfall(*a)
        self.shortfalls.append((a, out))
        return out

    def fetch_size(self, *a):
        self.fetches.append(a)
        return super().fetch_size(*a)


def drop_odd(args, samples, **kw):
    return samples[0].group_index % 2 == 0


def test_the_over_sampler_is_told_the_runs_true_counts(make_rollout, make_source):
    rollout = make_rollout(dynamic_filter=drop_odd, deterministic=True, over_sampling="adaptive")
    rollout.over_sampler = sampler = RecordingSampler(mode="adaptive")
    out = rollout(make_args(rollout_batch_size=3, n_samples_per_prompt=1), 0, make_source(n=1, buffered=False))
    assert len(out.samples) == 3
    assert sampler.shortfalls[0][0] == (3, 0, 0, 0, 0, 0, 3)
    for (target, submitted, dropped, kept, accepted, decided, osb), _ in sampler.shortfalls:
        assert target == 3 and osb == 3 and kept == accepted and accepted <= decided
        assert dropped == decided - accepted and 0 <= submitted - dropped
    assert any(a[4] > 0 and a[5] > a[4] for a, _ in sampler.shortfalls)  # some drops seen
    # each fetch is sized from the shortfall just computed and the same counts
    for fetch in sampler.fetches:
        match = [(a, s) for a, s in sampler.shortfalls
                 if s == fetch[2] and a[4:6] == fetch[3:5] and a[1] == fetch[5]]
        assert fetch[:2] == (3, 3) and match


def test_buffer_filters_see_the_engines_serving_version(make_rollout, make_source):
    engine = ScriptedEngine()
    engine.update_weights({}, 3)
    seen = []
    src = make_source(buffered=False)

    class Src:
        def get_samples(self, k):
            seen.append(serving_version())
            return src.get_samples(k)

    make_rollout(engine)(make_args(rollout_batch_size=1), 0, Src())
    assert seen and set(seen) == {3}


def test_groups_from_the_buffer_are_counted_over_every_fetch(make_rollout, make_source):
    src = make_source(n=1)
    src.add_samples(src.get_samples(4))  # four fresh groups waiting in the buffer
    rollout = make_rollout(finish_surplus=False, dynamic_filter=drop_odd, deterministic=True)
    out = rollout(make_args(rollout_batch_size=2, n_samples_per_prompt=1), 0, src)
    m = out.metrics
    # g0 kept, g1 dropped -> a second fetch of two: g2 kept, the batch is full
    assert m["rollout/fetch_rounds"] == 2 and m["rollout/groups_from_buffer"] == 4


class AbortsTwoEngine(ScriptedEngine):
    """Aborts the first request of samples 0 and 2 (two groups of two) after one token."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.cut: set[str] = set()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await super().generate(request)
        for tag in ("-s0-", "-s2-"):
            if tag in request.request_id and tag not in self.cut:
                self.cut.add(tag)
                return GenerationResult(request.request_id, result.output_ids[:1], result.text[:1], "abort", None)
        return result


@pytest.mark.parametrize("partial", [False, True])
def test_groups_the_engine_aborts_before_the_batch_fills_are_dropped_or_continued(partial, make_rollout,
                                                                                  make_source):
    args = make_args(rollout_batch_size=2, n_samples_per_prompt=2, over_sampling_batch_size=4,
                     partial_rollout=partial)
    src = make_source(n=2)
    out = make_rollout(AbortsTwoEngine(token_delay=0.002, max_filler=20), deterministic=True)(args, 0, src)
    m = out.metrics
    assert m["rollout/groups_dropped"] == 2
    assert {g[0].index for g in out.samples} == {4, 6}
    if partial:  # both go back to the buffer to be continued (deterministic: from their prompts)
        assert {0, 2} <= {g[0].index for g in src.buffer}


def test_fan_out_of_a_continued_sample_counts_its_siblings_tokens_less_the_earlier_ones(make_rollout, make_source):
    run = run_for(make_rollout, make_source, custom_generate_path="rollout_plugins.fanout_generate")
    sample = fresh(make_source)
    sample.tokens = run.ctx.tokenizer.encode(sample.prompt) + [65, 66]
    sample.response, sample.response_length, sample.status = "AB", 2, Sample.Status.ABORTED
    flight = Flight(0, [sample], tokens=5)
    out = run_item(run, flight, 0, sample)
    # both siblings hold the 2 earlier tokens; only the sample's 2 are subtracted (once: they were there before)
    assert flight.tokens == 5 + sum(s.response_length for s in out) - 2


class AbortDuringRequestEngine(ScriptedEngine):
    """Answers, but the batch fills (the context is marked aborted) while the request is in flight."""

    def __init__(self, run_ref: list, **kw: Any) -> None:
        super().__init__(**kw)
        self.run_ref = run_ref

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await super().generate(request)
        self.run_ref[0].ctx.aborted = True
        return GenerationResult(request.request_id, result.output_ids[:2], result.text[:2], "abort", None)


def test_a_sample_the_abort_reached_mid_request_still_gets_its_hooks(make_rollout, make_source):
    hook, ref = HookRecorder(), []
    run = run_for(make_rollout, make_source, engine=AbortDuringRequestEngine(ref),
                  sample_hooks=SampleHooks([("tests.hook", hook)]))
    ref.append(run)
    sample = fresh(make_source)
    run_item(run, Flight(0, [sample]), 0, sample)
    assert run.ctx.aborted and sample.response_length == 2
    assert [c["index"] for c in hook.calls] == [sample.index]


def test_a_custom_generate_that_returns_a_new_sample_gets_the_hooks(make_rollout, make_source):
    hook = HookRecorder()
    run = run_for(make_rollout, make_source, custom_generate_path="rollout_plugins.new_sample_generate",
                  sample_hooks=SampleHooks([("tests.hook", hook)]))
    sample = fresh(make_source)
    out = run_item(run, Flight(0, [sample]), 0, sample)
    assert out is not sample and sample.response_length == 0
    assert [c["sample"] for c in hook.calls] == [out]
