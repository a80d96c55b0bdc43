"""The reward's counted failures surface as this rollout's `reward/*` metrics (issue 31 item 10):
a remote reward model answering null scores 0 and is counted, per rollout, not cumulated."""

from __future__ import annotations

import pytest

from pipeline.rewards.dispatch import RewardDispatcher
from tests.engines.fake_server import FakeServer, serve

from rollout_helpers import make_args

pytestmark = pytest.mark.timeout(60)


def test_remote_null_answers_are_a_per_rollout_metric(make_rollout, make_source):
    answers = iter([None, 1.0] * 100)
    with serve(FakeServer(lambda p, b: (200, next(answers)))) as fake:
        reward = RewardDispatcher(rm_type="remote", remote_url=fake.url + "/rm", remote_backoff_s=0.01)
        rollout = make_rollout(reward=reward)
        src = make_source(n=2, buffered=False)
        args = make_args(rollout_batch_size=2, n_samples_per_prompt=2, over_sampling_batch_size=2)
        try:
            first = rollout(args, 0, src)
            second = rollout(args, 1, src)
        finally:
            reward.close()
    rewards = [s.reward for g in first.samples for s in g]
    assert sorted(rewards) == [0.0, 0.0, 1.0, 1.0]
    assert first.metrics["reward/remote_null_answers"] == 2 and first.metrics["reward/grade_timeouts"] == 0
    assert second.metrics["reward/remote_null_answers"] == 2   # this rollout's share, not the running total
