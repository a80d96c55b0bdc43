"""Where the groups a train rollout did not take go (pipeline/rollout/leftover_groups.py), decided
on hand-built groups: carried, restarted as fresh prompts, continued, or dropped, with the counters
and the start-rollout marks that go with each. The end-to-end runs are in test_engine_rollout.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest

from pipeline.rollout.leftover_groups import Flight, LeftoverGroups
from pipeline.samples.sample import Sample

pytestmark = pytest.mark.timeout(30)

ROLLOUT_ID = 3


class Buffer:
    def __init__(self):
        self.added: list[list[list]] = []

    def add_samples(self, groups):
        self.added.append(groups)


class Engine:
    def __init__(self):
        self.aborted = asyncio.Event()

    async def abort_all(self):
        self.aborted.set()


class Run(LeftoverGroups):
    """The state `TrainRun` gives the mixin, with the switches the decisions read."""

    def __init__(self, *, buffered=True, carry_surplus=True, finish_surplus=False, deterministic=False,
                 partial_rollout=False):
        self.engine_rollout = SimpleNamespace(finish_surplus=finish_surplus, carry_surplus=carry_surplus,
                                              deterministic=deterministic, engine=Engine())
        self.args = SimpleNamespace(partial_rollout=partial_rollout)
        self.rollout_id = ROLLOUT_ID
        self.data_source = Buffer()
        self.buffered = buffered
        self.ctx = SimpleNamespace(aborted=False)
        self.tasks = {}
        self.finished = {}
        self.count = Counter()
        self._pending_buffer = []


def done(index, response_length=2, **metadata):
    return Sample(index=index, tokens=[1, 2] + [7] * response_length, response="x" * response_length,
                  response_length=response_length, reward=1.0, status=Sample.Status.COMPLETED,
                  metadata=dict(metadata))


def cut(index, response_length=1, **metadata):
    """Aborted mid-generation (response_length 0: aborted before its turn)."""
    return Sample(index=index, tokens=[1, 2] + [7] * response_length, response="x" * response_length,
                  response_length=response_length, status=Sample.Status.ABORTED, metadata=dict(metadata))


def finish(run, *flights):
    for flight in flights:
        run.finished[flight.order] = flight
    asyncio.run(run._finish())
    return run.data_source.added[0] if run.data_source.added else []


def test_the_batch_filling_marks_the_context_aborted_before_in_flight_groups_end():
    run = Run(buffered=False)
    seen = {}

    async def in_flight():
        await run.engine_rollout.engine.aborted.wait()
        seen["aborted"] = run.ctx.aborted
        return None

    async def go():
        task = asyncio.ensure_future(in_flight())
        run.tasks[task] = Flight(0, [cut(0)], tokens=1)
        await run._finish()

    asyncio.run(go())
    assert seen == {"aborted": True} and run.ctx.aborted is True
    assert run.count["aborted_groups_dropped"] == 1


def test_dropped_surplus_groups_count_their_tokens_as_wasted():
    run = Run(buffered=False)
    run.count["wasted_tokens"] = 5
    assert finish(run, Flight(0, [done(0)], tokens=7), Flight(1, [done(1)], tokens=4)) == []
    assert run.count["surplus_groups_dropped"] == 2 and run.count["wasted_tokens"] == 16
    assert run.count["wasted_buffer_tokens"] == 0  # all made in this rollout


def test_continued_groups_keep_the_rollout_they_started_in():
    run = Run(partial_rollout=True)
    earlier, now, fresh = cut(0, start_rollout_id=1), cut(1), cut(2, response_length=0)
    assert finish(run, Flight(0, [earlier, now, fresh], tokens=2)) == [[earlier, now, fresh]]
    assert earlier.metadata["start_rollout_id"] == 1
    assert now.metadata["start_rollout_id"] == ROLLOUT_ID
    assert "start_rollout_id" not in fresh.metadata  # nothing generated: no start yet
    assert run.count["aborted_groups_to_buffer"] == 1 and run.count["aborted_groups_restarted"] == 0


def test_an_unfinished_fan_out_restarts_from_its_original_sample():
    run = Run(partial_rollout=True)
    original = cut(1, response_length=2, start_rollout_id=2)
    kept = cut(0)
    flight = Flight(0, [kept, [done(10), cut(11)]], tokens=3, originals={1: original})
    (group,) = finish(run, flight)
    assert group[0] is kept and kept.response_length == 1  # continued as it is
    assert group[1] is original
    assert original.response_length == 0 and original.tokens == [1, 2] and original.status == Sample.Status.PENDING
    assert "start_rollout_id" not in original.metadata


def test_deterministic_mode_restarts_a_continued_group_from_its_prompt():
    # what got generated before the abort depends on timing; seeded regeneration does not
    run = Run(partial_rollout=True, deterministic=True)
    a = cut(0, response_length=2)
    (group,) = finish(run, Flight(0, [a], tokens=2))
    assert group == [a] and a.response_length == 0 and a.tokens == [1, 2] and a.status == Sample.Status.PENDING
    assert run.count["wasted_tokens"] == 2 and run.count["aborted_groups_to_buffer"] == 1


def test_an_aborted_group_that_never_started_goes_back_as_fresh_prompts():
    # buffered source, no partial rollout, not deterministic: nothing was generated, so nothing is lost
    run = Run()
    a, b = cut(0, response_length=0), cut(1, response_length=0)
    a.reward = 0.0
    assert finish(run, Flight(0, [a, b], tokens=0)) == [[a, b]]
    assert a.status == Sample.Status.PENDING and b.status == Sample.Status.PENDING and a.reward is None
    assert run.count["aborted_groups_restarted"] == 1 and run.count["aborted_groups_to_buffer"] == 0
    assert run.count["aborted_groups_dropped"] == 0


@pytest.mark.parametrize("group", [
    lambda: [cut(0, response_length=0), cut(1, response_length=2)],  # one sample has a response (earlier rollout)
    lambda: [cut(0, response_length=0), [cut(1, response_length=0)]],  # a fan-out in flight
], ids=["a-sample-with-a-response", "a-fan-out"])
def test_an_aborted_group_that_started_is_dropped_without_partial_rollout(group):
    run = Run()
    assert finish(run, Flight(0, group(), tokens=0, originals={1: cut(1, response_length=0)})) == []
    assert run.count["aborted_groups_dropped"] == 1 and run.count["aborted_groups_restarted"] == 0


def test_an_aborted_group_with_tokens_generated_now_is_dropped_without_partial_rollout():
    run = Run()
    assert finish(run, Flight(0, [cut(0, response_length=0)], tokens=1)) == []
    assert run.count["aborted_groups_dropped"] == 1 and run.count["wasted_tokens"] == 1
    assert run.count["wasted_buffer_tokens"] == 0


def test_a_dropped_group_counts_tokens_of_earlier_rollouts_apart_from_this_ones():
    # no partial rollout: an aborted group holding a response from an earlier rollout (1 token)
    # and one made now (2 tokens) is dropped; both are thrown away, counted apart
    run = Run()
    group = [cut(0, response_length=1, start_rollout_id=1), cut(1, response_length=2)]
    assert finish(run, Flight(0, group, tokens=2)) == []
    assert run.count["aborted_groups_dropped"] == 1
    assert run.count["wasted_tokens"] == 2 and run.count["wasted_buffer_tokens"] == 1


def test_deterministic_restarts_count_the_continued_part_as_buffer_waste():
    run = Run(partial_rollout=True, deterministic=True)
    a = cut(0, response_length=3, start_rollout_id=1)  # 2 tokens from an earlier rollout, 1 now
    (group,) = finish(run, Flight(0, [a], tokens=1))
    assert group == [a] and a.response_length == 0
    assert run.count["wasted_tokens"] == 1 and run.count["wasted_buffer_tokens"] == 2


def test_a_continued_group_carried_on_wastes_nothing():
    run = Run(partial_rollout=True)
    a = cut(0, response_length=3, start_rollout_id=1)
    assert finish(run, Flight(0, [a], tokens=1)) == [[a]]
    assert run.count["wasted_tokens"] == 0 and run.count["wasted_buffer_tokens"] == 0
