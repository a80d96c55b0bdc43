"""The serving order of every bundled buffer filter, and what each leaves in the buffer.

Each test names groups by a tag in `metadata["tag"]`, builds a buffer, calls the filter and
compares the served tags and the remaining tags with the order the docstring promises.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import logging
from pathlib import Path

import pytest
import yaml

from pipeline.data.buffer_filters import OldestFirst, group_mean_reward, oldest_first, pop_first, reward_topk
from pipeline.samples.sample import Sample
from pipeline.samples.versions import reset_serving_version, set_serving_version

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
    filt = OldestFirst(max_staleness=None)
    assert serve(filt, buf, 3, rollout_id=5) == (["r0", "r1", "r2"], ["fresh1", "r3", "fresh2"])
    assert serve(filt, buf, 3, rollout_id=5) == (["r3", "fresh1", "fresh2"], [])
    assert filt.dropped == 0


def test_oldest_first_start_zero_is_older_than_one_and_ties_are_fifo():
    buf = [group("one", start=(1, 1)), group("zeroA", start=(0, 0)), group("fresh"), group("zeroB", start=(0, 0))]
    assert serve(OldestFirst(max_staleness=None), buf, 3, rollout_id=1) == (["zeroA", "zeroB", "one"], ["fresh"])


def test_oldest_first_group_age_is_its_oldest_sample():
    # a group whose samples started at 4 and 1 is older than one that started at 2
    buf = [group("two", start=(2, 2)), group("mixed", start=(4, 1)), group("half", start=(None, 3))]
    assert serve(OldestFirst(max_staleness=None), buf, 3, rollout_id=4) == (["mixed", "two", "half"], [])


def made_by(tag: str, *versions: int | None, start: int | None = None) -> list[Sample]:
    """A group tagged `tag` whose sample j has one response token made by weight version
    `versions[j]` (None: nothing generated yet), started at rollout `start`."""
    out = group(tag, rewards=[None] * len(versions), start=[start] * len(versions))
    for s, v in zip(out, versions):
        if v is not None:
            s.append_response_tokens(tokens=[7], meta_info={"token_weight_versions": [v], "weight_version": str(v),
                                                            "finish_reason": {"type": "stop"}})
    return out


def serve_at(filt: Any, buffer: list[list[Sample]], n: int, version: int | None) -> tuple[list[str], list[str]]:
    """`serve` while the rollout publishes serving weight version `version`."""
    token = set_serving_version(version)
    try:
        return serve(filt, buffer, n, rollout_id=9)
    finally:
        reset_serving_version(token)


def test_oldest_first_staleness_bound_counts_weight_versions_inclusively(caplog):
    caplog.set_level(logging.INFO, logger="pipeline.data.buffer_filters")
    filt = oldest_first(max_staleness=2)
    # serving version 5: made by 3 is 2 behind (kept), by 2 is 3 behind (dropped), nothing made is kept;
    # a group is as old as its oldest token (v1 and v4: dropped); start_rollout_id only orders
    buf = [made_by("v2", 2, 2, start=0), made_by("v3", 3, 3, start=1), made_by("fresh", None, None),
           made_by("v5", 5, 5, start=0), made_by("v1v4", 1, 4, start=0)]
    assert serve_at(filt, buf, 1, version=5) == (["v5"], ["v3", "fresh"])
    assert filt.dropped == 2 and filt.metrics() == {"buffer/stale_dropped": 2.0}
    assert [r.getMessage() for r in caplog.records if r.name == "pipeline.data.buffer_filters"] == [
        "oldest_first: dropped 2 groups staler than 2 weight versions at version 5 (rollout 9)"]
    # later drops add to the count: at version 6 the v3 group is 3 behind
    buf += [made_by("v6", 6, 6, start=4)]
    assert serve_at(filt, buf, 5, version=6) == (["v6", "fresh"], [])
    assert filt.dropped == 3 and filt.state_dict() == {"dropped": 3}


def test_oldest_first_counts_versions_not_rollouts():
    filt = OldestFirst(max_staleness=0)
    # started many rollouts ago but made by the weights served now: on-policy, kept
    buf = [made_by("old_rollout_same_weights", 4, 4, start=0), made_by("behind", 3, 4, start=4)]
    assert serve_at(filt, buf, 2, version=4) == (["old_rollout_same_weights"], [])
    assert filt.dropped == 1


def test_oldest_first_without_bound_or_serving_version_drops_nothing():
    old = [made_by("a", 0, 0, start=0), made_by("b", 1, 1, start=1)]
    assert serve_at(OldestFirst(max_staleness=None), old, 2, version=10_000) == (["a", "b"], [])
    filt = OldestFirst(max_staleness=0)
    buf = [made_by("a", 0, 0, start=0), made_by("b", 1, 1, start=1)]
    assert serve_at(filt, buf, 1, version=None) == (["a"], ["b"])  # outside a rollout
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


def test_oldest_first_built_without_arguments_has_the_yaml_bound():
    # slime's buffer_filter_path builds the class without arguments: it must behave as filter=oldest_first
    conf = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf/filter/oldest_first.yaml").read_text())
    assert OldestFirst().max_staleness == conf["max_staleness"] == 2
