"""Pre-flight of `train_async` / `max_weight_staleness` (pipeline/train/preflight.py's
`async_problems` and `async_warnings`) on plain config dicts, word for word: what is refused,
what is only warned about, and the boundaries (a bound of 1, one rollout, save_interval 1).
The same checks through `validate` and Hydra are in test_train_async.py."""

from __future__ import annotations

import pytest

from pipeline.train.preflight import async_problems, async_warnings

TRAINER = {"_target_": "pipeline.train.build.policy_gradient_trainer"}
NOT_BOOL = "train_async: expected true or false, got {!r}"
BAD_BOUND = ("max_weight_staleness: expected an integer >= 1 (how many weight versions generation runs "
             "behind the trainer), got {!r}")
NO_TRAINER = ("train_async: true overlaps generation with training, but trainer=none trains nothing; "
              "choose a trainer (trainer=policy_gradient or trainer=function) or set train_async=false")
NO_OVERLAP = ("train_async: true with save_interval=1: every checkpoint waits for its rollout's training "
              "before the next rollout is generated, so nothing overlaps; set save_interval > 1 "
              "(e.g. save_interval=10)")


def cfg(**keys):
    out = {"train_async": True, "max_weight_staleness": 1, "trainer": TRAINER, "save_interval": 10,
           "num_rollout": 5}
    out.update(keys)
    return out


@pytest.mark.parametrize("mode", [True, False])
@pytest.mark.parametrize("bound", [1, 2, 7])
def test_a_boolean_mode_and_a_bound_of_at_least_one_pass(mode, bound):
    assert async_problems(cfg(train_async=mode, max_weight_staleness=bound)) == []


@pytest.mark.parametrize("mode", ["yes", 1, 0, None, "true"])
def test_a_mode_that_is_not_a_boolean_is_refused_word_for_word(mode):
    assert async_problems(cfg(train_async=mode)) == [NOT_BOOL.format(mode)]


@pytest.mark.parametrize("bound", [0, -1, 1.5, 1.0, True, "2", None])
def test_a_bound_that_is_not_an_integer_of_at_least_one_is_refused_word_for_word(bound):
    assert async_problems(cfg(max_weight_staleness=bound)) == [BAD_BOUND.format(bound)]


def test_both_bad_are_both_named_mode_first():
    assert async_problems(cfg(train_async="on", max_weight_staleness=0)) == [NOT_BOOL.format("on"),
                                                                               BAD_BOUND.format(0)]


@pytest.mark.parametrize("trainer", [None, {}, {"_target_": None}, "policy_gradient"])
def test_async_without_a_trainer_is_refused_word_for_word(trainer):
    assert async_problems(cfg(trainer=trainer)) == [NO_TRAINER]
    # with a bad bound too, both are named
    assert async_problems(cfg(trainer=trainer, max_weight_staleness=0)) == [BAD_BOUND.format(0), NO_TRAINER]


@pytest.mark.parametrize("trainer", [None, {}])
def test_sync_runs_without_a_trainer_are_fine(trainer):
    assert async_problems(cfg(trainer=trainer, train_async=False)) == []
    # a truthy mode that is not `true` is refused as such, not as a missing trainer
    assert async_problems(cfg(trainer=trainer, train_async=1)) == [NOT_BOOL.format(1)]


def test_a_function_trainer_by_path_counts_as_a_trainer():
    assert async_problems(cfg(trainer={"path": "mypkg.train"})) == []


@pytest.mark.parametrize("bound", [2, 5])
def test_a_staleness_bound_without_async_is_warned_about_word_for_word(bound):
    assert async_warnings(cfg(train_async=False, max_weight_staleness=bound)) == [
        f"max_weight_staleness={bound} has no effect without train_async=true (sync mode trains each "
        f"rollout before the next is generated)"]


@pytest.mark.parametrize("keys", [
    {"train_async": False, "max_weight_staleness": 1},     # the default bound
    {"train_async": True, "max_weight_staleness": 3},      # used
    {"train_async": None, "max_weight_staleness": 3},      # a bad mode: refused, not warned
    {"train_async": 0, "max_weight_staleness": 3},
    {"train_async": False, "max_weight_staleness": "3"},   # a bad bound: refused, not warned
    {"train_async": False, "max_weight_staleness": True},
])
def test_no_staleness_warning_otherwise(keys):
    assert async_warnings(cfg(**keys)) == []


@pytest.mark.parametrize("num_rollout", [2, 3, 100])
def test_async_with_a_checkpoint_every_rollout_is_warned_about_word_for_word(num_rollout):
    assert async_warnings(cfg(save_interval=1, num_rollout=num_rollout)) == [NO_OVERLAP]


@pytest.mark.parametrize("keys", [
    {"save_interval": 1, "num_rollout": 1},       # one rollout: nothing to overlap anyway
    {"save_interval": 1, "num_rollout": 0},
    {"save_interval": 1, "num_rollout": None},
    {"save_interval": 1, "num_rollout": "3"},
    {"save_interval": 1, "num_rollout": True},
    {"save_interval": 2, "num_rollout": 3},
    {"save_interval": None, "num_rollout": 3},
    {"save_interval": 1, "num_rollout": 3, "train_async": False},
    {"save_interval": 1, "num_rollout": 3, "train_async": 1},
])
def test_no_overlap_warning_otherwise(keys):
    assert async_warnings(cfg(**keys)) == []


def test_the_staleness_warning_comes_alone():
    """sync mode: the save_interval warning is about async runs only"""
    assert async_warnings(cfg(train_async=False, max_weight_staleness=2, save_interval=1, num_rollout=3)) == [
        "max_weight_staleness=2 has no effect without train_async=true (sync mode trains each "
        "rollout before the next is generated)"]
