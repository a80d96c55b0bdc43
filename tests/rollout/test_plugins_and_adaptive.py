"""Custom generate (fan-out, evaluation flag, bad output) and adaptive over-sampling."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pipeline.rollout.contracts import DynamicFilterOutput, PluginOutputError
from pipeline.rollout.over_sampling import OverSampler

from rollout_helpers import make_args

pytestmark = pytest.mark.timeout(60)


def test_fanout_siblings_share_rollout_id(make_rollout, make_source):
    args = make_args(rollout_batch_size=2, n_samples_per_prompt=2)
    out = make_rollout(custom_generate_path="rollout_plugins.fanout_generate")(args, 0, make_source(buffered=False))
    assert len(out.samples) == 2
    seen = set()
    for group in out.samples:
        assert len(group) == 2
        for item in group:
            assert isinstance(item, list) and len(item) == 2
            ids = {s.rollout_id for s in item}
            assert len(ids) == 1 and None not in ids
            seen |= ids
            assert all(s.reward is not None for s in item), "every sibling is scored"
    assert len(seen) == 4, "different parents get different trajectory ids"


def test_per_sample_generate_path_and_params(make_rollout, make_source):
    src = make_source(buffered=False)
    args = make_args(rollout_batch_size=1, rollout_max_response_len=77)

    class Src:
        def get_samples(self, k: int) -> list:
            groups = src.get_samples(k)
            for g in groups:
                g[0].generate_function_path = "rollout_plugins.tagged_generate"
            return groups

    out = make_rollout()(args, 0, Src())
    first, second = out.samples[0]
    assert first.metadata == {"evaluation": False, "max_new_tokens": 77}
    assert "evaluation" not in second.metadata


def test_plugin_with_wrong_output_is_named(make_rollout, make_source):
    with pytest.raises(PluginOutputError, match="rollout_plugins.bad_generate"):
        make_rollout(custom_generate_path="rollout_plugins.bad_generate")(
            make_args(rollout_batch_size=1), 0, make_source(buffered=False))


def test_plugin_outside_allowlist_is_refused(make_rollout, make_source):
    args = make_args(rollout_batch_size=1, allowed_targets=["pipeline."], allowed_targets_extra=[])
    with pytest.raises(Exception, match="not allowed"):
        make_rollout(custom_generate_path="rollout_plugins.tagged_generate")(args, 0, make_source(buffered=False))


def test_adaptive_fetch_size_unit():
    fixed = OverSampler("fixed")
    assert fixed.fetch_size(4, 16, 4, 0, 0, submitted=0) == 16
    ad = OverSampler("adaptive", min_fetch=1, max_fetch_factor=3, min_pass_rate=0.1,
                     prior_pass_rate=1.0, prior_weight=0.0, smoothing=1.0)
    assert ad.fetch_size(4, 16, 4, 0, 0, submitted=0) == 4  # no evidence yet: the prior (all pass)
    assert ad.fetch_size(4, 16, 1, 1, 4, submitted=4) == 4  # 25% pass: 1 missing -> 4 groups
    assert ad.fetch_size(4, 16, 4, 0, 10, submitted=0) == 12  # 0% pass clamps to 10% and to 3x batch
    # ... and to what is left of the look-ahead budget, max(osb, 4 / 0.1); past it, as before
    assert ad.look_ahead_budget(4, 16) == 40 and ad.look_ahead_budget(4, 48) == 48
    assert ad.fetch_size(4, 16, 4, 0, 10, submitted=34) == 6
    assert ad.fetch_size(4, 16, 4, 0, 10, submitted=40) == 12
    assert OverSampler("adaptive", min_pass_rate=0.3).look_ahead_budget(3, 3) == 10  # ceil(3 / 0.3)
    ad.end_rollout(accepted=2, decided=8)
    assert ad.pass_rate == pytest.approx(0.25)
    assert ad.fetch_size(4, 16, 4, 0, 0, submitted=0) == 12  # next rollout starts from the learned rate
    with pytest.raises(ValueError, match="over_sampling"):
        OverSampler("sometimes")


def half(args: Any, samples: list, **kw: Any) -> DynamicFilterOutput:
    keep = samples[0].group_index % 2 == 0
    return DynamicFilterOutput(keep=keep, reason=None if keep else "odd")


def test_adaptive_wastes_less_than_fixed(make_rollout, make_source):
    args = make_args(rollout_batch_size=4, n_samples_per_prompt=2, over_sampling_batch_size=16)
    totals = {}
    for mode in ("fixed", "adaptive"):
        rollout = make_rollout(dynamic_filter=half, over_sampling=mode, deterministic=True)
        src = make_source(buffered=False)
        fetched = tokens = 0
        for rid in range(3):
            out = rollout(args, rid, src)
            assert len(out.samples) == 4 and all(g[0].group_index % 2 == 0 for g in out.samples)
            fetched += out.metrics["rollout/groups_fetched"]
            tokens += out.metrics["rollout/tokens_generated"]
        totals[mode] = (fetched, tokens / 12)
    assert totals["fixed"][0] == 48
    # the ideal at a 50% pass rate is 8 groups per rollout of 4
    assert totals["adaptive"][0] <= 3 * 9
    assert totals["adaptive"][1] < totals["fixed"][1]


def test_group_reward_gets_whole_groups_with_the_real_dispatcher(make_rollout, make_source, tmp_path):
    import rollout_plugins
    from pipeline.rewards.dispatch import RewardDispatcher

    from rollout_helpers import write_prompts
    from pipeline.rollout.eval import EngineEval
    from pipeline.engines.scripted import ScriptedEngine

    reward = RewardDispatcher(rm_type=None, custom_rm_path="rollout_plugins.group_reward", group_rm=True)
    rollout_plugins.GROUP_SIZES.clear()
    out = make_rollout(reward=reward)(make_args(rollout_batch_size=2, n_samples_per_prompt=3), 0,
                                      make_source(n=3, buffered=False))
    assert rollout_plugins.GROUP_SIZES and set(rollout_plugins.GROUP_SIZES) == {3}
    assert all(sorted(s.reward for s in g) == [0.0, 1.0, 2.0] for g in out.samples)
    rollout_plugins.GROUP_SIZES.clear()
    ev = EngineEval(engine=ScriptedEngine(), reward=reward, progress=False,
                    datasets=[{"name": "e", "path": str(write_prompts(tmp_path / "e.jsonl", 2)),
                               "n_samples_per_eval_prompt": 4}])
    res = ev(make_args(), 0)
    assert rollout_plugins.GROUP_SIZES == [4, 4] and len(res.data["e"]["rewards"]) == 8


def test_adaptive_fetches_on_the_projected_count_fixed_on_drops():
    fixed = OverSampler("fixed")
    # 4 in flight, none decided: slime waits for drops
    assert fixed.shortfall(4, submitted=4, dropped=0, kept=0, accepted=0, decided=0, over_sampling_batch_size=4) == 0
    assert fixed.shortfall(4, submitted=4, dropped=1, kept=0, accepted=0, decided=1, over_sampling_batch_size=4) == 1
    ad = OverSampler("adaptive", prior_pass_rate=1.0, prior_weight=0.0, smoothing=1.0)
    assert ad.shortfall(4, submitted=4, dropped=0, kept=0, accepted=0, decided=0, over_sampling_batch_size=4) == 0
    # 1 kept, 1 dropped (p = 0.5), 2 in flight: projected 1 + 0.5 * 2 = 2 of 4 -> 2 missing
    s = ad.shortfall(4, submitted=4, dropped=1, kept=1, accepted=1, decided=2, over_sampling_batch_size=4)
    assert s == pytest.approx(2.0)
    assert ad.fetch_size(4, 4, s, accepted=1, decided=2, submitted=4) == 4
    # once enough is in flight at the observed rate, no fetch is due
    assert ad.shortfall(4, submitted=8, dropped=1, kept=1, accepted=1, decided=2, over_sampling_batch_size=4) <= 0
    # past the look-ahead budget (max(4, 4 / 0.1) = 40 submitted) only drops below the batch fetch
    assert ad.shortfall(4, submitted=39, dropped=35, kept=1, accepted=1, decided=36, over_sampling_batch_size=4) > 0
    assert ad.shortfall(4, submitted=40, dropped=36, kept=1, accepted=1, decided=37, over_sampling_batch_size=4) == 0
    assert ad.shortfall(4, submitted=40, dropped=37, kept=1, accepted=1, decided=38, over_sampling_batch_size=4) == 1


def half_with_fallback(args: Any, samples: list, **kw: Any) -> DynamicFilterOutput:
    out = half(args, samples)
    out.keep_when_insufficient = True
    return out


def test_adaptive_with_the_fallback_filter_still_learns_the_pass_rate(make_rollout, make_source):
    """Groups the fallback keeps (the batch could not fill otherwise) are no passes: counted as
    passes, the estimate would read 100% from a first round of just the batch, no rollout would
    ever fetch more than the batch, and the filter would never drop a group."""
    args = make_args(rollout_batch_size=4, n_samples_per_prompt=2, over_sampling_batch_size=16)
    rollout = make_rollout(dynamic_filter=half_with_fallback, over_sampling="adaptive", deterministic=True)
    src = make_source(buffered=False)
    outs = [rollout(args, rid, src) for rid in range(3)]
    for out in outs:
        assert out.metrics["rollout/groups_fetched"] > 4
        assert out.metrics["rollout/filter_pass_rate"] == pytest.approx(0.5, abs=0.1)
    assert sum(o.metrics.get("rollout/dynamic_filter/drop_odd", 0) for o in outs) >= 6
    assert sum(sum(g[0].group_index % 2 == 0 for g in o.samples) for o in outs) >= 10  # mostly passes kept


def none_pass_with_fallback(args: Any, samples: list, **kw: Any) -> DynamicFilterOutput:
    return DynamicFilterOutput(keep=False, reason="zero_std_0.0", keep_when_insufficient=True)


def test_adaptive_with_the_fallback_filter_fills_a_batch_nothing_passes(make_rollout, make_source):
    """Every reward 0 (nothing passes): the adaptive look-ahead stops once this rollout has
    submitted max(over_sampling_batch_size, batch / min_pass_rate) = 40 groups, so (submitted −
    dropped) falls to the batch size and the fallback keeps the rest. Before, adaptive kept
    1 / min_pass_rate batches in flight, never reached that point and fetched forever."""
    args = make_args(rollout_batch_size=4, n_samples_per_prompt=2, over_sampling_batch_size=16)
    rollout = make_rollout(dynamic_filter=none_pass_with_fallback, over_sampling="adaptive", deterministic=True)
    src = make_source(buffered=False)
    for rid in range(2):
        out = rollout(args, rid, src)
        assert len(out.samples) == 4
        assert out.metrics["rollout/dynamic_filter/kept_insufficient"] == 4
        assert out.metrics["rollout/groups_submitted"] == 40  # the look-ahead budget, then no more
        assert out.metrics["rollout/dynamic_filter/drop_zero_std_0.0"] == 36
        assert out.metrics["rollout/filter_pass_rate"] == 0


class DropFirst:
    """A dynamic filter dropping its first `n` groups (every reward 0, say), then keeping."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def __call__(self, args: Any, samples: list, **kw: Any) -> DynamicFilterOutput:
        self.seen += 1
        return DynamicFilterOutput(keep=self.seen > self.n, reason="zero_std_0.0")


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_a_filter_passing_nothing_for_long_is_named_at_20x_the_batch_and_each_doubling(
        make_rollout, make_source, caplog, mode):
    """slime's loop fetches for ever while its filter passes nothing; ours too, but it says so:
    at 20 x the batch submitted (40 for a batch of 2) and again at 80, naming the drops."""
    from pipeline.rollout.train_run import STARVING_FACTOR

    assert STARVING_FACTOR == 20
    args = make_args(rollout_batch_size=2, n_samples_per_prompt=1, over_sampling_batch_size=2)
    rollout = make_rollout(dynamic_filter=DropFirst(85), over_sampling=mode, deterministic=True)
    with caplog.at_level("WARNING", logger="pipeline.rollout.train_run"):
        out = rollout(args, 0, make_source(buffered=False))
    assert len(out.samples) == 2 and out.metrics["rollout/dynamic_filter/drop_zero_std_0.0"] == 85
    said = [r.getMessage() for r in caplog.records if "groups submitted for a batch of" in r.getMessage()]
    assert len(said) == 2, said
    for text, at in zip(said, (40, 80)):
        submitted = int(re.match(r"rollout 0: (\d+) groups submitted", text).group(1))
        # fixed fetches 2 at a time and lands on it; adaptive's rounds may cross it (past its budget
        # of 20 groups it fetches as fixed does, sized by its estimate)
        assert submitted == at if mode == "fixed" else at <= submitted < at + 10
        assert text.startswith(f"rollout 0: {submitted} groups submitted for a batch of 2, 0 kept so far (dynamic "
                               f"filter drops: zero_std_0.0 ")
        assert text.endswith("a dynamic filter that passes (almost) nothing keeps this rollout fetching for ever, "
                             "as slime's does: check the rewards (rollout/raw_reward), or let it keep groups when "
                             "short (dynamic_filter=nonzero_std_fallback)")
    # the counter starts again with each rollout, and a filter that passes is never named
    caplog.clear()
    rollout.dynamic_filter = DropFirst(0)
    with caplog.at_level("WARNING", logger="pipeline.rollout.train_run"):
        rollout(args, 1, make_source(buffered=False))
    assert "groups submitted for a batch of" not in caplog.text
