"""Weight versions on tokens with the scripted engine: recorded per token, shown by a continued
partial sample, masked off-policy, staleness metrics (counted in versions)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.engines.base import GenerationRequest, SamplingParams
from pipeline.engines.scripted import ScriptedEngine
from pipeline.rollout.sample_generate import GenContext, default_generate, reset_sample
from pipeline.samples.sample import Sample
from pipeline.samples.versions import RUNS_KEY, oldest_version, staleness, token_versions

from rollout_helpers import make_args

pytestmark = pytest.mark.timeout(60)


def test_without_updates_every_token_is_version_0_and_nothing_new_is_dumped(make_rollout, make_source):
    out = make_rollout()(make_args(rollout_batch_size=2, n_samples_per_prompt=2), 3, make_source(n=2, buffered=False))
    for s in (s for g in out.samples for s in g):
        assert s.weight_versions == ["0"] and RUNS_KEY not in s.metadata
        assert token_versions(s) == [0] * s.response_length
    assert out.metrics["rollout/weight_staleness"] == 0.0 == out.metrics["rollout/weight_staleness_mean"]
    assert out.metrics["rollout/offpolicy_tokens_masked"] == 0


def test_scripted_engine_stamps_each_token_and_refuses_a_version_that_does_not_advance():
    engine = ScriptedEngine(token_delay=0.01, max_filler=6)

    async def go() -> Any:
        req = GenerationRequest("r", text="3 + 4", sampling=SamplingParams(max_new_tokens=60, seed=1))
        task = asyncio.create_task(engine.generate(req))
        await asyncio.sleep(0.08)
        engine.update_weights({"w": None}, 4)
        return await task

    res = asyncio.run(go())
    assert len(res.weight_versions) == len(res.output_ids)
    first_new = res.weight_versions.index(4)
    assert 0 < first_new < len(res.output_ids)
    assert res.weight_versions == [0] * first_new + [4] * (len(res.output_ids) - first_new)
    assert engine.weight_version == 4 and engine.last_update_names == ["w"]
    for bad in (4, 3, "5", True):
        with pytest.raises(ValueError, match="version must be an int > the current version 4"):
            engine.update_weights({}, bad)
    assert engine.weight_version == 4


def test_a_continued_partial_sample_shows_both_versions_and_its_old_tokens_are_masked(make_rollout, make_source):
    engine = ScriptedEngine(token_delay=0.002, max_filler=12)
    args = make_args(rollout_batch_size=1, n_samples_per_prompt=1, over_sampling_batch_size=6,
                     partial_rollout=True, mask_offpolicy_in_partial_rollout=True)
    src = make_source(n=1)
    rollout = make_rollout(engine)
    rollout(args, 0, src)
    partial = {g[0].index: g[0].response_length for g in src.buffer if g[0].status == Sample.Status.ABORTED}
    assert partial and all(partial.values())
    engine.update_weights({}, 1)  # the trainer's step between the rollouts
    out = rollout(make_args(rollout_batch_size=5, n_samples_per_prompt=1, partial_rollout=True,
                            mask_offpolicy_in_partial_rollout=True), 1, src)
    continued = [g[0] for g in out.samples if g[0].index in partial]
    assert len(continued) == len(partial)
    for s in continued:
        old = partial[s.index]
        assert s.weight_versions == ["0", "1"]
        assert s.metadata[RUNS_KEY] == [[0, old], [1, s.response_length - old]]
        assert token_versions(s) == [0] * old + [1] * (s.response_length - old)
        assert s.loss_mask == [0] * old + [1] * (s.response_length - old)
        assert oldest_version(s) == 0 and staleness(s, 1) == 1
    m = out.metrics
    assert m["rollout/weight_staleness"] == 1.0
    # version-0 tokens: the continued samples' first parts and any carried surplus group
    n_old = sum(v == 0 for g in out.samples for s in g for v in token_versions(s))
    assert n_old >= sum(partial.values())
    n_all = sum(s.response_length for g in out.samples for s in g)
    assert m["rollout/weight_staleness_mean"] == pytest.approx(n_old / n_all)


def test_without_masking_old_tokens_stay_trainable_with_their_log_probs(make_rollout, make_source):
    engine = ScriptedEngine(token_delay=0.002, max_filler=12)
    args = make_args(rollout_batch_size=1, n_samples_per_prompt=1, over_sampling_batch_size=6, partial_rollout=True)
    src = make_source(n=1)
    rollout = make_rollout(engine)
    rollout(args, 0, src)
    partial = {g[0].index: g[0].response_length for g in src.buffer if g[0].status == Sample.Status.ABORTED}
    engine.update_weights({}, 1)
    out = rollout(make_args(rollout_batch_size=5, n_samples_per_prompt=1, partial_rollout=True), 1, src)
    continued = [g[0] for g in out.samples if g[0].index in partial]
    assert continued
    for s in continued:
        # the trainer importance-weights them (TIS) with these rollout log-probs
        assert s.loss_mask == [1] * s.response_length and len(s.rollout_log_probs) == s.response_length
        assert token_versions(s)[: partial[s.index]] == [0] * partial[s.index]
    assert out.metrics["rollout/offpolicy_tokens_masked"] == 0


def test_an_update_during_a_request_masks_the_tokens_of_the_older_version(tokenizer):
    engine = ScriptedEngine(token_delay=0.01, max_filler=8)
    ctx = GenContext(engine=engine, tokenizer=tokenizer, rollout_id=0)
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 80, "seed": 3}

    async def go(masking: bool) -> Sample:
        sample = Sample(index=0, prompt="5 + 6")
        args = make_args(partial_rollout=True, mask_offpolicy_in_partial_rollout=masking)
        task = asyncio.create_task(default_generate(ctx, args, sample, params))
        await asyncio.sleep(0.1)
        engine.update_weights({}, engine.weight_version + 1)
        return await task

    s = asyncio.run(go(masking=True))
    runs = s.metadata[RUNS_KEY]
    assert [r[0] for r in runs] == [0, 1] and runs[0][1] > 0 and runs[1][1] > 0
    assert s.weight_versions == ["0", "1"]
    assert s.loss_mask == [0] * runs[0][1] + [1] * runs[1][1]
    assert ctx.offpolicy_tokens_masked == runs[0][1]
    s2 = asyncio.run(go(masking=False))
    assert s2.weight_versions == ["1", "2"] and set(s2.loss_mask) == {1}
    reset_sample(s2)
    assert RUNS_KEY not in s2.metadata and s2.weight_versions == []


def test_runs_cover_tool_tokens_and_bad_version_lists_change_nothing():
    s = Sample(index=5, tokens=[1, 2])
    s.append_response_tokens(tokens=[3, 4], meta_info={"token_weight_versions": [2, 2], "weight_version": "2",
                                                       "finish_reason": {"type": "stop"}})
    assert RUNS_KEY not in s.metadata and token_versions(s) == [2, 2]
    s.append_response_tokens(tokens=[9], trainable=False)  # tool output: no engine made it
    s.append_response_tokens(tokens=[5], meta_info={"token_weight_versions": [3]})
    assert s.metadata[RUNS_KEY] == [[2, 2], [None, 1], [3, 1]]
    assert token_versions(s) == [2, 2, None, 3] and oldest_version(s) == 2
    before = s.to_dict()
    with pytest.raises(ValueError, match="2 token_weight_versions for 1 tokens"):
        s.append_response_tokens(tokens=[6], meta_info={"token_weight_versions": [3, 3]})
    assert s.to_dict() == before


def test_the_weight_version_survives_a_checkpoint_for_the_trainer_to_restore(make_rollout, make_source, tmp_path,
                                                                             caplog):
    from pipeline.loop.runner import ROLLOUT_STATE_KEY

    engine = ScriptedEngine()
    rollout = make_rollout(engine)
    src = make_source(n=2, save_dir=tmp_path / "ck")
    rollout(make_args(rollout_batch_size=1, n_samples_per_prompt=2), 0, src)
    engine.update_weights({}, 3)
    src.metadata[ROLLOUT_STATE_KEY] = rollout.state_dict()  # what the runner stashes before a save
    src.save(0)
    resumed_src = make_source(n=2, save_dir=tmp_path / "ck")
    assert resumed_src.load() == 0
    resumed = make_rollout(ScriptedEngine())
    with caplog.at_level("WARNING", logger="pipeline.rollout.engine_rollout"):
        resumed.load_state_dict(resumed_src.metadata[ROLLOUT_STATE_KEY])
    assert resumed.resumed_weight_version == 3
    assert "written at weight version 3, the engine serves 0" in caplog.text
    # a checkpoint written before weight versions existed reads as version 0
    resumed.load_state_dict({"over_sampler": rollout.state_dict()["over_sampler"]})
    assert resumed.resumed_weight_version == 0
