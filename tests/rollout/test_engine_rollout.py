"""EngineRollout with the scripted engine: over-sampling, filters, abort, partial rollout, surplus."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.engines.base import GenerationRequest, GenerationResult
from pipeline.engines.scripted import ScriptedEngine
from pipeline.rollout.contracts import DynamicFilterOutput, RolloutFnTrainOutput
from pipeline.samples.sample import Sample

from rollout_helpers import make_args

pytestmark = pytest.mark.timeout(60)


class SpyEngine(ScriptedEngine):
    """Scripted engine that records every request."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        return await super().generate(request)


def drop_odd(args: Any, samples: list[Sample], **kw: Any) -> DynamicFilterOutput:
    """Drops groups with an odd group_index (deterministic 50% pass rate)."""
    keep = samples[0].group_index % 2 == 0
    return DynamicFilterOutput(keep=keep, reason=None if keep else "odd")


def drop_odd_with_fallback(args: Any, samples: list[Sample], **kw: Any) -> DynamicFilterOutput:
    out = drop_odd(args, samples)
    out.keep_when_insufficient = True
    return out


def keep_every_fourth(args: Any, samples: list[Sample], **kw: Any) -> DynamicFilterOutput:
    keep = samples[0].group_index % 4 == 0
    return DynamicFilterOutput(keep=keep, reason=None if keep else "skip")


def group_indices(out: RolloutFnTrainOutput) -> list[int]:
    return [g[0].group_index for g in out.samples]


def test_basic_batch_is_exact_sorted_and_scored(make_rollout, make_source, tokenizer):
    args = make_args(rollout_batch_size=4, n_samples_per_prompt=3, over_sampling_batch_size=6)
    src = make_source(n=3, buffered=False)
    out = make_rollout()(args, 0, src)
    assert isinstance(out, RolloutFnTrainOutput)
    assert len(out.samples) == 4
    firsts = [g[0].index for g in out.samples]
    assert firsts == sorted(firsts)
    rewards = []
    for group in out.samples:
        assert len(group) == 3
        for s in group:
            assert s.status == Sample.Status.COMPLETED
            prompt_ids = tokenizer.encode(s.prompt)
            assert s.tokens[: len(prompt_ids)] == prompt_ids
            assert len(s.tokens) == len(prompt_ids) + s.response_length
            assert "\\boxed{" in s.response
            assert len(s.rollout_log_probs) == s.response_length
            rewards.append(s.reward)
    assert set(rewards) <= {0.0, 1.0} and len(set(rewards)) == 2, "scripted rewards should vary"
    assert out.metrics["rollout/tokens_generated"] > 0
    assert out.metrics["rollout/surplus_groups_dropped"] + 4 + out.metrics["rollout/aborted_groups_dropped"] == 6


def test_over_sampling_counts_and_drop_metric(make_rollout, make_source):
    # deterministic admission: g0 keep, g1 drop -> fetch 4 more, g2 keep, g3 drop, g4 keep, g5 drop, g6 keep
    args = make_args(rollout_batch_size=4, n_samples_per_prompt=2)
    out = make_rollout(dynamic_filter=drop_odd, deterministic=True)(args, 0, make_source(buffered=False))
    assert group_indices(out) == [0, 2, 4, 6]
    m = out.metrics
    assert m["rollout/groups_submitted"] == 8
    assert m["rollout/fetch_rounds"] == 2
    assert m["rollout/groups_dropped"] == 3
    assert m["rollout/dynamic_filter/drop_odd"] == 3
    assert m["rollout/filter_pass_rate"] == pytest.approx(4 / 7)  # decided in order: 4 kept of 7


def test_keep_when_insufficient(make_rollout, make_source):
    # 6 submitted: g1 dropped (remaining 5), g3 dropped (4), g5 kept since remaining 4 <= 4
    args = make_args(rollout_batch_size=4, over_sampling_batch_size=6)
    out = make_rollout(dynamic_filter=drop_odd_with_fallback, deterministic=True)(args, 0, make_source(buffered=False))
    assert group_indices(out) == [0, 2, 4, 5]
    assert out.metrics["rollout/dynamic_filter/drop_odd"] == 2
    assert out.metrics["rollout/groups_submitted"] == 6
    # g5 is no pass of the filter: the pass rate (and the adaptive estimate) counts 3 of 6
    assert out.metrics["rollout/dynamic_filter/kept_insufficient"] == 1
    assert out.metrics["rollout/filter_pass_rate"] == pytest.approx(3 / 6)
    # without the fallback the same filter needs another round
    out2 = make_rollout(dynamic_filter=drop_odd, deterministic=True)(args, 0, make_source(buffered=False))
    assert group_indices(out2) == [0, 2, 4, 6]
    assert out2.metrics["rollout/groups_submitted"] == 12


def test_bare_bool_filter_is_accepted(make_rollout, make_source):
    args = make_args(rollout_batch_size=2)
    filt = lambda args, samples: samples[0].group_index != 0  # noqa: E731
    out = make_rollout(dynamic_filter=filt, deterministic=True)(args, 0, make_source(buffered=False))
    assert group_indices(out) == [1, 2]
    assert out.metrics["rollout/dynamic_filter/drop_filtered"] == 1


def test_abort_partial_rollout_to_buffer_and_continuation(make_rollout, make_source, tokenizer):
    engine = SpyEngine(token_delay=0.002, max_filler=12)
    args = make_args(rollout_batch_size=1, n_samples_per_prompt=1, over_sampling_batch_size=6,
                     partial_rollout=True, mask_offpolicy_in_partial_rollout=True)
    src = make_source(n=1)
    rollout = make_rollout(engine)
    out0 = rollout(args, 0, src)
    m0 = out0.metrics
    assert len(out0.samples) == 1
    assert m0["rollout/aborted_groups_to_buffer"] >= 1
    assert m0["rollout/aborted_groups_to_buffer"] + m0["rollout/surplus_groups_carried"] == 5
    assert len(src.buffer) == 5
    partial = [g[0] for g in src.buffer if g[0].status == Sample.Status.ABORTED]
    assert partial and all(s.response_length > 0 for s in partial), "aborted samples keep partial tokens"
    assert all(s.metadata["start_rollout_id"] == 0 for s in partial)
    assert all(s.reward is None for s in partial)
    before = {s.index: (list(s.tokens), s.response_length, s.response) for s in partial}

    engine.requests.clear()
    args1 = make_args(rollout_batch_size=5, n_samples_per_prompt=1, partial_rollout=True,
                      mask_offpolicy_in_partial_rollout=True)
    out1 = rollout(args1, 1, src)
    m1 = out1.metrics
    assert m1["rollout/continued_samples"] == len(partial)
    by_index = {g[0].index: g[0] for g in out1.samples}
    assert set(before) <= set(by_index), "buffered groups come first"
    for idx, (tokens, rlen, text) in before.items():
        s = by_index[idx]
        assert s.tokens[: len(tokens)] == tokens, "continued, not restarted"
        assert s.response.startswith(text)
        assert s.response_length > rlen
        assert s.loss_mask[:rlen] == [0] * rlen and set(s.loss_mask[rlen:]) == {1}
        assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
        assert s.metadata["start_rollout_id"] == 0 and s.reward is not None
        req = next(r for r in engine.requests if r.input_ids == tokens)
        assert req.sampling.max_new_tokens == args1.rollout_max_response_len - rlen
        # the continuation ends with the script's answer (unseeded, it is a fresh script: a partial
        # aborted after its answer but before EOS holds two answers then)
        assert s.response.count("\\boxed{") == 1 + text.count("\\boxed{") or s.status == Sample.Status.TRUNCATED
        assert s.response.endswith("}.") or s.status == Sample.Status.TRUNCATED


def test_surplus_is_carried_reused_and_stale_regenerated(make_rollout, make_source):
    engine = SpyEngine()
    args = make_args(rollout_batch_size=2, n_samples_per_prompt=2, over_sampling_batch_size=8)
    src = make_source(n=2)
    rollout = make_rollout(engine, surplus_max_staleness=1)
    out0 = rollout(args, 0, src)
    m0 = out0.metrics
    carried = m0["rollout/surplus_groups_carried"]
    assert carried >= 1 and m0["rollout/aborted_groups_dropped"] + carried == 6
    assert m0["rollout/buffer_size"] == carried == len(src.buffer)
    for g in src.buffer:
        assert all(s.status == Sample.Status.COMPLETED and s.reward is not None for s in g)
        assert all(s.metadata["start_rollout_id"] == 0 for s in g)
    reused_ids = [g[0].index for g in src.buffer[:2]]
    assert m0["rollout/wasted_buffer_tokens"] == 0  # nothing came from the buffer
    n_requests = len(engine.requests)
    out1 = rollout(make_args(rollout_batch_size=2, n_samples_per_prompt=2), 1, src)
    assert [g[0].index for g in out1.samples] == reused_ids
    assert out1.metrics["rollout/surplus_groups_reused"] == 2
    assert len(engine.requests) == n_requests, "carried groups are not generated again"
    assert out1.metrics["rollout/weight_staleness"] == 0.0
    if src.buffer:
        # rollouts alone do not age a group: staleness counts weight versions
        engine.update_weights({}, 1)
        out2 = rollout(make_args(rollout_batch_size=1, n_samples_per_prompt=2), 2, src)
        assert out2.metrics["rollout/stale_groups_regenerated"] == 0
        assert out2.metrics["rollout/surplus_groups_reused"] == 1
        assert out2.metrics["rollout/weight_staleness"] == 1.0 == out2.metrics["rollout/weight_staleness_mean"]
        assert len(engine.requests) == n_requests
    if src.buffer:
        # two versions behind, over the bound of 1: regenerated instead of reused
        engine.update_weights({}, 2)
        stale = src.buffer[0]
        stale_tokens = sum(s.response_length for s in stale)
        out3 = rollout(make_args(rollout_batch_size=1, n_samples_per_prompt=2), 3, src)
        assert out3.metrics["rollout/stale_groups_regenerated"] == 1
        # its old responses are thrown away: tokens of an earlier rollout
        assert out3.metrics["rollout/wasted_buffer_tokens"] == stale_tokens > 0
        assert out3.metrics["rollout/wasted_tokens"] == 0
        assert len(engine.requests) > n_requests
        assert out3.samples[0][0].index == stale[0].index
        assert out3.samples[0][0].weight_versions == ["2"]
        assert out3.metrics["rollout/weight_staleness"] == 0.0
        assert all("start_rollout_id" not in s.metadata for s in out3.samples[0])


def drop_carried(args: Any, samples: list[Sample], **kw: Any) -> DynamicFilterOutput:
    """Drops the groups an earlier rollout generated (carried surplus)."""
    keep = "start_rollout_id" not in samples[0].metadata
    return DynamicFilterOutput(keep=keep, reason=None if keep else "carried")


def test_carried_groups_the_filter_drops_count_as_buffer_waste(make_rollout, make_source):
    engine = SpyEngine()
    src = make_source(n=2)
    out0 = make_rollout(engine)(make_args(rollout_batch_size=2, n_samples_per_prompt=2,
                                          over_sampling_batch_size=8), 0, src)
    carried = [list(g) for g in src.buffer]
    assert carried and out0.metrics["rollout/wasted_buffer_tokens"] == 0
    carried_tokens = sum(s.response_length for g in carried for s in g)
    out1 = make_rollout(engine, dynamic_filter=drop_carried, finish_surplus=False)(
        make_args(rollout_batch_size=1, n_samples_per_prompt=2, over_sampling_batch_size=1), 1, src)
    m = out1.metrics
    assert m["rollout/dynamic_filter/drop_carried"] == len(carried) == m["rollout/groups_from_buffer"]
    # the carried groups' tokens were made in rollout 0: not this rollout's generation
    assert m["rollout/wasted_buffer_tokens"] == carried_tokens > 0
    assert m["rollout/tokens_generated"] == sum(s.response_length for g in out1.samples for s in g) \
        + sum(s.response_length for g in src.buffer for s in g) + m["rollout/wasted_tokens"]


def test_surplus_without_buffer_is_counted_dropped(make_rollout, make_source):
    args = make_args(rollout_batch_size=2, over_sampling_batch_size=8)
    out = make_rollout()(args, 0, make_source(buffered=False))
    m = out.metrics
    assert m["rollout/surplus_groups_carried"] == 0
    assert m["rollout/surplus_groups_dropped"] + m["rollout/aborted_groups_dropped"] == 6


def test_partial_rollout_needs_buffer(make_rollout, make_source):
    with pytest.raises(ValueError, match="data_source=buffered"):
        make_rollout()(make_args(partial_rollout=True), 0, make_source(buffered=False))


def test_over_sampling_smaller_than_batch_is_refused(make_rollout, make_source):
    with pytest.raises(ValueError, match="over_sampling_batch_size"):
        make_rollout()(make_args(rollout_batch_size=4, over_sampling_batch_size=2), 0, make_source())


def test_deterministic_mode_is_reproducible(make_rollout, make_source):
    args = make_args(rollout_batch_size=3, n_samples_per_prompt=2, over_sampling_batch_size=5)

    def run(**kw: Any) -> list[list[list[int]]]:
        out = make_rollout(SpyEngine(**kw), dynamic_filter=drop_odd, deterministic=True)(args, 0, make_source())
        return [[s.tokens for s in g] for g in out.samples]

    a = run()
    b = run(token_delay=0.001)
    assert a == b


def test_summary_logged_and_callable_from_a_running_loop(make_rollout, make_source, caplog):
    import asyncio
    import logging

    rollout = make_rollout(progress=True)
    args = make_args(rollout_batch_size=2)

    async def caller() -> RolloutFnTrainOutput:
        return rollout(args, 5, make_source(buffered=False))  # a sync call from inside a loop

    with caplog.at_level(logging.INFO, logger="pipeline.rollout.train_run"):
        out = asyncio.run(caller())
    assert len(out.samples) == 2
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "rollout 5 done" in text and "tokens_generated" in text


def test_engine_error_propagates_and_cancels(make_rollout, make_source):
    class Broken(ScriptedEngine):
        async def generate(self, request: GenerationRequest) -> GenerationResult:
            if request.request_id.endswith("-3"):
                raise RuntimeError("replica exploded")
            return await super().generate(request)

    with pytest.raises(RuntimeError, match="replica exploded"):
        make_rollout(Broken(token_delay=0.001))(make_args(rollout_batch_size=2), 0, make_source(buffered=False))


def test_message_prompts_are_rendered_with_the_chat_template(make_rollout, tokenizer):
    class MessageSource:
        def __init__(self) -> None:
            self.i = 0

        def get_samples(self, k: int) -> list[list[Sample]]:
            out = []
            for _ in range(k):
                msgs = [{"role": "user", "content": f"What is {self.i} + 1?"}]
                out.append([Sample(group_index=self.i, index=2 * self.i + j, prompt=list(msgs),
                                   label=str(self.i + 1)) for j in range(2)])
                self.i += 1
            return out

    out = make_rollout()(make_args(rollout_batch_size=2), 0, MessageSource())
    for group in out.samples:
        s = group[0]
        rendered = tokenizer.apply_chat_template(s.prompt, tokenize=False)
        assert tokenizer.decode(s.tokens).startswith(rendered)
        assert s.response and s.reward is not None


@pytest.mark.parametrize("kw,expected", [
    ({}, False), ({"deterministic": True, "batch_invariant_log_probs": True}, True),
    ({"deterministic": True, "batch_invariant_log_probs": False}, False),
])
def test_requests_ask_for_batch_invariant_log_probs_when_configured(kw, expected, make_rollout, make_source):
    engine = SpyEngine()
    make_rollout(engine, **kw)(make_args(rollout_batch_size=2), 0, make_source(n=2, buffered=False))
    assert engine.requests and {r.sampling.batch_invariant for r in engine.requests} == {expected}


LEFTOVER_KEYS = ("surplus_groups_carried", "surplus_groups_dropped", "aborted_groups_to_buffer",
                 "aborted_groups_dropped", "aborted_groups_restarted")


class AbortsFirstEngine(ScriptedEngine):
    """Scripted engine that aborts sample 0's first request after one token (an engine restart)."""

    aborted = False

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = await super().generate(request)
        if "-s0-" in request.request_id and not self.aborted:
            self.aborted = True
            return GenerationResult(request.request_id, result.output_ids[:1], result.text[:1], "abort", None)
        return result


@pytest.mark.parametrize("case", ["plain", "buffered", "buffered_finish", "deterministic", "partial",
                                  "engine_abort", "filtered"])
def test_every_group_and_token_is_kept_buffered_or_counted_wasted(case, make_rollout, make_source):
    """Whatever the timing: each submitted group is kept, carried to the buffer or dropped, and
    each generated token is in the batch, in the buffer or counted in rollout/wasted_tokens."""
    args = make_args(rollout_batch_size=2, n_samples_per_prompt=2, over_sampling_batch_size=8,
                     partial_rollout=case == "partial")
    engine = (AbortsFirstEngine if case == "engine_abort" else ScriptedEngine)(token_delay=0.001, max_filler=10)
    rollout = make_rollout(engine, deterministic=case in ("deterministic", "filtered"),
                           finish_surplus=case == "buffered_finish",
                           dynamic_filter=keep_every_fourth if case == "filtered" else None)
    src = make_source(n=2, buffered=case != "plain")
    out = rollout(args, 0, src)
    m = out.metrics
    buffer = getattr(src, "buffer", [])
    filtered = m.get("rollout/dynamic_filter/drop_skip", 0)
    assert m["rollout/groups_submitted"] == len(out.samples) + sum(m[f"rollout/{k}"] for k in LEFTOVER_KEYS) + filtered
    assert len(buffer) == m["rollout/groups_to_buffer"] == (
        m["rollout/surplus_groups_carried"] + m["rollout/aborted_groups_to_buffer"]
        + m["rollout/aborted_groups_restarted"])
    kept = sum(s.response_length for g in out.samples for s in g)
    buffered = sum(s.response_length for g in buffer for s in g)
    assert m["rollout/tokens_generated"] == kept + buffered + m["rollout/wasted_tokens"]
    unfinished = [g for g in buffer if any(s.status not in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
                                           for s in g)]
    if case == "plain":
        assert buffer == [] and m["rollout/surplus_groups_dropped"] + m["rollout/aborted_groups_dropped"] == 6
    if case == "deterministic":  # what got generated for a group not admitted depends on timing: regenerated
        assert all(s.response_length == 0 and s.status == Sample.Status.PENDING for g in buffer for s in g)
        assert len(buffer) == 6 and m["rollout/wasted_tokens"] == m["rollout/tokens_generated"] - kept
    if case in ("buffered", "buffered_finish"):  # no partial rollout: unfinished groups come back fresh
        assert all(s.response_length == 0 and s.status == Sample.Status.PENDING for g in unfinished for s in g)
        assert m["rollout/aborted_groups_to_buffer"] == 0
    if case == "buffered_finish":  # the groups in flight finish into the buffer
        assert m["rollout/surplus_groups_finished"] > 0 and unfinished == []
        assert m["rollout/aborted_groups_dropped"] == m["rollout/aborted_groups_restarted"] == 0
    else:
        assert m["rollout/surplus_groups_finished"] == 0
    if case == "partial":  # unfinished groups keep their tokens, marked with the rollout they started in
        assert m["rollout/aborted_groups_restarted"] == m["rollout/aborted_groups_dropped"] == 0
        assert all(s.metadata["start_rollout_id"] == 0 for g in buffer for s in g if s.response_length)
    if case == "filtered":  # decided in order: g1, g2, g3 dropped (their tokens wasted), g0 and g4 kept
        assert filtered == 3 and group_indices(out) == [0, 4]
    if case == "engine_abort":  # the group the engine aborted before the batch filled: dropped, never kept
        assert m["rollout/groups_dropped"] >= 1 and all(g[0].index != 0 for g in out.samples)
        assert m["rollout/aborted_groups_dropped"] >= 1 and not any(s.index == 0 for g in buffer for s in g)
    assert all("start_rollout_id" not in s.metadata for g in buffer for s in g if not s.response_length)


def test_buffer_traffic_fetches_and_one_encode_per_fetch(make_rollout, make_source, tokenizer):
    calls: list[int] = []

    class CountingTokenizer(type(tokenizer)):
        def __call__(self, text, **kw):
            calls.append(len(text) if isinstance(text, list) else 1)
            return super().__call__(text, **kw)

    src = make_source(n=2)
    src.add_samples(src.get_samples(2))  # two fresh groups waiting in the buffer
    rollout = make_rollout(tokenizer=CountingTokenizer(), finish_surplus=False, dynamic_filter=drop_odd)
    out = rollout(make_args(rollout_batch_size=2, n_samples_per_prompt=2), 0, src)
    m = out.metrics
    assert m["rollout/groups_from_buffer"] == 2 and m["rollout/groups_fetched"] == m["rollout/groups_submitted"]
    assert m["rollout/fetch_rounds"] >= 2 and m["rollout/groups_fetched"] > 2
    # every fetch round's fresh prompts go to the tokenizer in one batched call, none one by one
    assert len(calls) == m["rollout/fetch_rounds"] and sum(calls) == 2 * m["rollout/groups_fetched"]


def test_a_data_source_that_returns_nothing_is_an_error(make_rollout):
    class Empty:
        def get_samples(self, num):
            return []

    with pytest.raises(RuntimeError, match=r"^rollout 3: the data source returned no groups when asked for 2$"):
        make_rollout()(make_args(rollout_batch_size=2), 3, Empty())


def test_every_group_kept_only_by_the_fallback_is_counted(make_rollout, make_source):
    """A filter that passes nothing, with the fallback: the batch fills with groups the filter
    failed, each counted as kept_insufficient, and the pass rate is 0 (not 1)."""

    def fail_all(args: Any, samples: list[Sample], **kw: Any) -> DynamicFilterOutput:
        return DynamicFilterOutput(keep=False, reason="none", keep_when_insufficient=True)

    args = make_args(rollout_batch_size=4, over_sampling_batch_size=4)
    out = make_rollout(dynamic_filter=fail_all, deterministic=True)(args, 0, make_source(buffered=False))
    assert group_indices(out) == [0, 1, 2, 3]
    assert out.metrics["rollout/dynamic_filter/kept_insufficient"] == 4
    assert out.metrics["rollout/filter_pass_rate"] == 0.0
