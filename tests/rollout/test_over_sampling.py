"""pipeline/rollout/over_sampling.py's arithmetic on its own: the checks of its settings, the
pass-rate estimate, the look-ahead budget, the shortfall and the fetch size of `fixed` and
`adaptive`, and the carried-over rate. Through a real rollout: test_plugins_and_adaptive.py."""

from __future__ import annotations

import math

import pytest

from pipeline.rollout.over_sampling import OverSampler


def adaptive(**keys) -> OverSampler:
    return OverSampler("adaptive", **keys)


# -- settings --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("keys", "message"), [
    ({"mode": "greedy"}, "rollout.over_sampling: expected one of ['fixed', 'adaptive'], got 'greedy'"),
    ({"min_fetch": 0}, "rollout.adaptive.min_fetch: expected >= 1, got 0"),
    ({"max_fetch_factor": 0.5}, "rollout.adaptive.max_fetch_factor: expected >= 1, got 0.5"),
    ({"min_pass_rate": 0.0}, "rollout.adaptive.min_pass_rate: expected a number in (0, 1], got 0.0"),
    ({"min_pass_rate": 1.5}, "rollout.adaptive.min_pass_rate: expected a number in (0, 1], got 1.5"),
    ({"prior_pass_rate": 0.0}, "rollout.adaptive.prior_pass_rate: expected a number in (0, 1], got 0.0"),
    ({"prior_pass_rate": 1.01}, "rollout.adaptive.prior_pass_rate: expected a number in (0, 1], got 1.01"),
    ({"smoothing": 0}, "rollout.adaptive.smoothing: expected a number in (0, 1], got 0"),
    ({"smoothing": 2}, "rollout.adaptive.smoothing: expected a number in (0, 1], got 2"),
    ({"prior_weight": -0.5}, "rollout.adaptive.prior_weight: expected >= 0, got -0.5"),
])
def test_each_bad_setting_is_refused_word_for_word(keys, message):
    with pytest.raises(ValueError) as err:
        OverSampler(**keys)
    assert str(err.value) == message


def test_the_bounds_themselves_are_accepted_and_kept_as_numbers():
    s = OverSampler("fixed", min_fetch=1, max_fetch_factor=1, min_pass_rate=1.0, prior_pass_rate=1.0,
                    prior_weight=0, smoothing=1.0)
    assert (s.mode, s.min_fetch, s.max_fetch_factor, s.min_pass_rate, s.pass_rate, s.prior_weight,
            s.smoothing) == ("fixed", 1, 1.0, 1.0, 1.0, 0.0, 1.0)
    s = adaptive(min_fetch=3.0, max_fetch_factor=2, min_pass_rate=0.25, prior_pass_rate=0.5,
                 prior_weight=2, smoothing=0.5)
    assert type(s.min_fetch) is int and s.min_fetch == 3
    assert all(type(v) is float for v in (s.max_fetch_factor, s.min_pass_rate, s.pass_rate, s.prior_weight,
                                           s.smoothing))
    assert (s.max_fetch_factor, s.min_pass_rate, s.pass_rate, s.prior_weight) == (2.0, 0.25, 0.5, 2.0)


def test_the_defaults_are_conf_rollout_engine_yamls():
    from pathlib import Path

    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[2] / "conf"
    yaml = OmegaConf.to_container(OmegaConf.load(conf / "rollout" / "engine.yaml"))
    s = OverSampler()
    assert s.mode == yaml["over_sampling"] == "fixed"
    for key in ("min_fetch", "max_fetch_factor", "min_pass_rate", "prior_weight", "smoothing"):
        assert getattr(s, key) == yaml["adaptive"][key], key
    assert s.pass_rate == yaml["adaptive"]["prior_pass_rate"]
    assert set(OverSampler.ADAPTIVE_KEYS) == set(yaml["adaptive"])


# -- the estimate ----------------------------------------------------------------------------------

def test_the_estimate_blends_this_rollouts_decisions_with_the_carried_rate():
    s = adaptive(prior_pass_rate=1.0, prior_weight=4.0, min_pass_rate=0.1)
    assert s.estimate(0, 0) == 1.0                           # nothing decided: the prior
    assert s.estimate(2, 4) == pytest.approx((2 + 4) / (4 + 4))
    assert s.estimate(1, 12) == pytest.approx((1 + 4) / (12 + 4))
    assert s.estimate(0, 100) == 0.1                         # clamped at min_pass_rate
    assert s.estimate(5, 1) == 1.0                           # and at 1
    s = adaptive(prior_pass_rate=0.5, prior_weight=2.0, min_pass_rate=0.1)
    assert s.estimate(3, 4) == pytest.approx((3 + 2 * 0.5) / (4 + 2))


def test_without_a_prior_weight_the_estimate_is_this_rollouts_rate_or_else_the_carried_one():
    s = adaptive(prior_pass_rate=0.6, prior_weight=0, min_pass_rate=0.1)
    assert s.estimate(0, 0) == 0.6
    assert s.estimate(1, 4) == 0.25
    assert s.estimate(0, 4) == 0.1


# -- the look-ahead budget -------------------------------------------------------------------------

@pytest.mark.parametrize(("target", "osbs", "min_pass_rate", "budget"), [
    (8, 4, 0.1, 80),       # ceil(8 / 0.1)
    (8, 4, 0.3, 27),       # ceil(26.67)
    (8, 40, 0.3, 40),      # never less than one fixed round
    (3, 1, 0.5, 6),
    (7, 1, 0.7, 10),       # 7 / 0.7 is 10.000000000000002 in floats: still 10
    (1, 1, 1.0, 1),
])
def test_the_budget_is_what_the_lowest_pass_rate_needs_and_at_least_one_fixed_round(
        target, osbs, min_pass_rate, budget):
    assert adaptive(min_pass_rate=min_pass_rate).look_ahead_budget(target, osbs) == budget
    assert type(adaptive(min_pass_rate=min_pass_rate).look_ahead_budget(target, float(osbs))) is int


# -- the shortfall ---------------------------------------------------------------------------------

def test_fixed_is_short_by_the_batch_less_what_was_not_dropped():
    s = OverSampler("fixed")
    got = s.shortfall(8, submitted=10, dropped=4, kept=3, accepted=3, decided=7, over_sampling_batch_size=4)
    assert got == 2.0 and type(got) is float
    assert s.shortfall(8, 8, 0, 0, 0, 0, 4) == 0.0
    assert s.shortfall(8, 0, 0, 0, 0, 0, 4) == 8.0


def test_adaptive_projects_the_undecided_groups_at_the_estimated_rate():
    s = adaptive(prior_pass_rate=1.0, prior_weight=4.0, min_pass_rate=0.1)
    # kept 2 of 3 decided, 1 dropped, 6 submitted: 3 undecided at p = (2 + 4) / (3 + 4)
    got = s.shortfall(8, submitted=6, dropped=1, kept=2, accepted=2, decided=3, over_sampling_batch_size=4)
    assert got == pytest.approx(8 - 2 - (6 / 7) * 3)
    # nothing decided yet: p is the prior, every submitted group counts
    assert s.shortfall(8, 5, 0, 0, 0, 0, 4) == pytest.approx(3.0)


def test_adaptive_past_its_budget_is_short_as_fixed_is():
    s = adaptive(min_pass_rate=0.5)                          # budget for 4: max(2, 8) = 8
    assert s.look_ahead_budget(4, 2) == 8
    # one below the budget: projected (0 kept + 1.0 x 7 undecided, prior 1)
    assert s.shortfall(4, 7, 0, 0, 0, 0, 2) == pytest.approx(4 - 7.0)
    # at the budget: target - (submitted - dropped), the projection no longer counts
    assert s.shortfall(4, 8, 6, 0, 0, 6, 2) == 2.0
    assert s.shortfall(4, 9, 6, 1, 1, 7, 2) == 1.0


# -- the fetch size --------------------------------------------------------------------------------

def test_fixed_fetches_one_over_sampling_batch_whatever_is_missing():
    s = OverSampler("fixed")
    assert s.fetch_size(8, 4, 0.5, 0, 0, 0) == 4
    assert s.fetch_size(8, 12, 7.0, 3, 9, 100) == 12


def test_adaptive_fetches_the_shortfall_over_the_pass_rate():
    s = adaptive(prior_pass_rate=1.0, prior_weight=4.0, min_pass_rate=0.1, min_fetch=1, max_fetch_factor=4)
    assert s.fetch_size(8, 4, 3.0, 0, 0, 0) == 3              # p = 1: what is missing
    assert s.fetch_size(8, 4, 3.0, 2, 4, 6) == 4              # p = 0.75: ceil(4.0) (not 5: float guard)
    assert s.fetch_size(8, 4, 2.2, 2, 4, 6) == math.ceil(2.2 / 0.75)
    assert s.fetch_size(8, 4, 0.2, 0, 0, 0) == 1              # at least min_fetch
    assert adaptive(min_fetch=3).fetch_size(8, 4, 0.2, 0, 0, 0) == 3


def test_adaptive_fetches_at_most_max_fetch_factor_batches_and_never_below_min_fetch():
    s = adaptive(prior_pass_rate=1.0, prior_weight=0.0, min_pass_rate=0.1, min_fetch=1, max_fetch_factor=2)
    # p = 0.1 (1 of 10): 5 / 0.1 = 50, capped at 2 x 8 = 16; the budget (80) leaves 70
    assert s.fetch_size(8, 4, 5.0, 1, 10, 10) == 16
    # a cap below min_fetch: min_fetch wins
    assert adaptive(min_fetch=5, max_fetch_factor=1, prior_weight=0.0).fetch_size(2, 1, 5.0, 1, 10, 10) == 5
    assert adaptive(min_fetch=1, max_fetch_factor=1.5).fetch_size(3, 1, 9.0, 0, 0, 0) == 4  # int(4.5)


def test_adaptive_rounds_stop_at_the_budget_and_past_it_fetch_as_before():
    s = adaptive(prior_pass_rate=1.0, prior_weight=4.0, min_pass_rate=0.5, max_fetch_factor=4)  # budget 8 for 4
    assert s.fetch_size(4, 2, 4.0, 0, 0, 0) == 4              # 4 of the 8 left
    assert s.fetch_size(4, 2, 4.0, 0, 0, 6) == 2              # only 2 left: a round never crosses it
    assert s.fetch_size(4, 2, 4.0, 0, 0, 7) == 1
    assert s.fetch_size(4, 2, 3.0, 0, 0, 8) == 3              # at the budget: sized as before
    assert s.fetch_size(4, 2, 3.0, 0, 0, 20) == 3


# -- across rollouts -------------------------------------------------------------------------------

def test_each_rollout_folds_its_rate_into_the_carried_one():
    s = adaptive(prior_pass_rate=1.0, smoothing=0.5)
    s.end_rollout(accepted=1, decided=4)
    assert s.pass_rate == pytest.approx(0.5 * 1.0 + 0.5 * 0.25)
    s.end_rollout(accepted=0, decided=0)                      # nothing decided: unchanged
    assert s.pass_rate == pytest.approx(0.625)
    t = adaptive(prior_pass_rate=0.8, smoothing=0.25)
    t.end_rollout(accepted=2, decided=2)
    assert t.pass_rate == pytest.approx(0.75 * 0.8 + 0.25 * 1.0)
    one = adaptive(prior_pass_rate=1.0, smoothing=0.5)
    one.end_rollout(accepted=0, decided=1)                    # a single decision counts too
    assert one.pass_rate == 0.5


def test_the_state_round_trips_the_carried_rate():
    s = adaptive(prior_pass_rate=1.0, smoothing=0.5)
    s.end_rollout(1, 2)
    state = s.state_dict()
    assert state == {"mode": "adaptive", "pass_rate": 0.75}
    fresh = adaptive(prior_pass_rate=1.0)
    fresh.load_state_dict({"mode": "adaptive", "pass_rate": "0.75"})
    assert fresh.pass_rate == 0.75 and type(fresh.pass_rate) is float
    assert OverSampler("fixed").state_dict() == {"mode": "fixed", "pass_rate": 1.0}
