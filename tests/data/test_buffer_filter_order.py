"""The serving order of every bundled buffer filter, and what each leaves in the buffer.

Each test names groups by a tag in `metadata["tag"]`, builds a buffer, calls the filter and
compares the served tags and the remaining tags with the order the docstring promises.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import logging

import pytest

from pipeline.data.buffer_filters import OldestFirst, group_mean_reward, oldest_first, pop_first, reward_topk
from pipeline.sample import Sample

pytestmark = pytest.mark.timeout(30)

ARGS = SimpleNamespace(reward_key=None)


def group(tag: str, rewards: list[Any] = (None, None), start: Any = (None, None)) -> list[Sample]:
    """A group tagged `tag`; sample j has reward `rewards[j]` and start_rollout_id `start[j]`."""
    out = []
    for j, r in enumerate(rewards):
        meta: dict[str, Any] = {"tag": tag}
        if start[j] is not None:
            meta["start_rollout_id"] = start[j]
        out.append(Sample(index=j, reward=r, metadata=meta))
    return out


def tags(groups: list[list[Sample]]) -> list[str]:
    return [g[0].metadata["tag"] for g in groups]


def serve(filt: Any, buffer: list[list[Sample]], n: int, rollout_id: int | None = 0) -> tuple[list[str], list[str]]:
    served = filt(ARGS, rollout_id, buffer, n)
    return tags(served), tags(buffer)


# ------------------------------------------------------------------ pop_first
def test_pop_first_serves_the_oldest_in_buffer_order():
    buf = [group(t) for t in "abcde"]
    assert serve(pop_first, buf, 2) == (["a", "b"], ["c", "d", "e"])
    assert serve(pop_first, buf, 5) == (["c", "d", "e"], [])
    assert serve(pop_first, buf, 3) == ([], [])


def test_pop_first_zero_request_serves_nothing():
    buf = [group(t) for t in "ab"]
    assert serve(pop_first, buf, 0) == ([], ["a", "b"])


# ------------------------------------------------------------------ reward_topk
def test_reward_topk_serves_highest_mean_first():
    # buffer order is neither ascending nor descending, and means are asymmetric within groups
    buf = [group("mid", [1.0, 0.0]), group("low", [0.0, 0.0]), group("top", [1.0, 1.0]),
           group("neg", [-1.0, 0.0]), group("high", [1.0, 0.5])]
    assert serve(reward_topk, buf, 3) == (["top", "high", "mid"], ["low", "neg"])
    assert serve(reward_topk, buf, 5) == (["low", "neg"], [])


def test_reward_topk_ties_are_fifo():
    buf = [group("a", [0.5, 0.5]), group("b", [1.0, 0.0]), group("c", [0.0, 1.0]), group("d", [0.5, 0.5])]
    assert serve(reward_topk, buf, 2) == (["a", "b"], ["c", "d"])
    assert serve(reward_topk, buf, 1) == (["c"], ["d"])


def test_reward_topk_unrewarded_groups_rank_last_in_buffer_order():
    # a zero mean still outranks a group with no reward; a partly scored group counts as unrewarded
    buf = [group("none1"), group("zero", [0.0, 0.0]), group("partial", [1.0, None]),
           group("none2"), group("neg", [-2.0, -2.0]), group("one", [1.0, 1.0])]
    assert serve(reward_topk, buf, 4) == (["one", "zero", "neg", "none1"], ["partial", "none2"])
    assert serve(reward_topk, buf, 2) == (["partial", "none2"], [])


def test_reward_topk_request_larger_than_buffer_and_zero():
    buf = [group("a", [0.0, 0.0]), group("b", [1.0, 1.0])]
    assert serve(reward_topk, buf, 0) == ([], ["a", "b"])
    assert serve(reward_topk, buf, 9) == (["b", "a"], [])


def test_reward_topk_ranks_by_reward_key():
    args = SimpleNamespace(reward_key="acc")
    buf = [[Sample(reward={"acc": 0.0, "len": 9.0}, metadata={"tag": "a"})],
           [Sample(reward={"acc": 1.0, "len": 0.0}, metadata={"tag": "b"})]]
    assert tags(reward_topk(args, 0, buf, 1)) == ["b"] and tags(buf) == ["a"]


def test_group_mean_reward_values():
    assert group_mean_reward(ARGS, group("x", [1.0, 0.0, 0.0, 0.0], [None] * 4)) == 0.25
    assert group_mean_reward(ARGS, group("x", [3.0], [None])) == 3.0
    assert group_mean_reward(ARGS, group("x", [-1.0, -3.0])) == -2.0
    assert group_mean_reward(ARGS, group("x", [1.0, None])) is None
    assert group_mean_reward(ARGS, group("x", [None, 1.0])) is None
    assert group_mean_reward(ARGS, []) is None
    plain = [SimpleNamespace(reward=2), SimpleNamespace(reward=4)]  # duck-typed samples: `.reward`
    assert group_mean_reward(ARGS, plain) == 3.0


# ------------------------------------------------------------------ oldest_first
def test_oldest_first_serves_smallest_start_first_then_never_started_in_buffer_order():
    buf = [group("fresh1"), group("r3", start=(3, 3)), group("r1", start=(1, 1)), group("fresh2"),
           group("r0", start=(0, 0)), group("r2", start=(2, 2))]
    filt = OldestFirst()
    assert serve(filt, buf, 3, rollout_id=5) == (["r0", "r1", "r2"], ["fresh1", "r3", "fresh2"])
    assert serve(filt, buf, 3, rollout_id=5) == (["r3", "fresh1", "fresh2"], [])
    assert filt.dropped == 0


def test_oldest_first_start_zero_is_older_than_one_and_ties_are_fifo():
    buf = [group("one", start=(1, 1)), group("zeroA", start=(0, 0)), group("fresh"), group("zeroB", start=(0, 0))]
    assert serve(OldestFirst(), buf, 3, rollout_id=1) == (["zeroA", "zeroB", "one"], ["fresh"])


def test_oldest_first_group_age_is_its_oldest_sample():
    # a group whose samples started at 4 and 1 is older than one that started at 2
    buf = [group("two", start=(2, 2)), group("mixed", start=(4, 1)), group("half", start=(None, 3))]
    assert serve(OldestFirst(), buf, 3, rollout_id=4) == (["mixed", "two", "half"], [])


def test_oldest_first_staleness_bound_is_inclusive_and_counted(caplog):
    caplog.set_level(logging.INFO, logger="pipeline.data.buffer_filters")
    filt = oldest_first(max_staleness=2)
    # at rollout 5: started at 3 is 2 old (kept), at 2 is 3 old (dropped), never started is kept
    buf = [group("s2", start=(2, 2)), group("s3", start=(3, 3)), group("fresh"), group("s5", start=(5, 5)),
           group("s1", start=(1, 4))]
    assert serve(filt, buf, 1, rollout_id=5) == (["s3"], ["fresh", "s5"])
    assert filt.dropped == 2 and filt.metrics() == {"buffer/stale_dropped": 2.0}
    assert [r.getMessage() for r in caplog.records if r.name == "pipeline.data.buffer_filters"] == [
        "oldest_first: dropped 2 groups staler than 2 rollouts at rollout 5"]
    # later drops add to the count
    buf += [group("s6", start=(6, 6))]
    assert serve(filt, buf, 5, rollout_id=8) == (["s6", "fresh"], [])
    assert filt.dropped == 3 and filt.state_dict() == {"dropped": 3}


def test_oldest_first_bound_zero_keeps_only_this_rollout():
    filt = OldestFirst(max_staleness=0)
    buf = [group("old", start=(3, 3)), group("now", start=(4, 4))]
    assert serve(filt, buf, 2, rollout_id=4) == (["now"], [])
    assert filt.dropped == 1


def test_oldest_first_without_bound_or_rollout_id_drops_nothing():
    old = [group("a", start=(0, 0)), group("b", start=(1, 1))]
    assert serve(OldestFirst(), old, 2, rollout_id=10_000) == (["a", "b"], [])
    filt = OldestFirst(max_staleness=0)
    buf = [group("a", start=(0, 0)), group("b", start=(1, 1))]
    assert serve(filt, buf, 1, rollout_id=None) == (["a"], ["b"])
    assert filt.dropped == 0


def test_oldest_first_state_round_trip_and_bad_bound():
    a = OldestFirst(max_staleness=1)
    a.dropped = 7
    b = OldestFirst(max_staleness=1)
    b.load_state_dict(a.state_dict())
    assert b.dropped == 7 and b.metrics() == {"buffer/stale_dropped": 7.0}
    for bad in (-1, 1.5, "2"):
        with pytest.raises(ValueError, match="max_staleness"):
            OldestFirst(max_staleness=bad)
    assert OldestFirst(max_staleness=0).max_staleness == 0
