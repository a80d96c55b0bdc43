"""The slime-style HTTP generate, unchanged, against the real engines: the in-process hf engine
(SmolLM2-135M) and two Ray replicas of it, one short rollout each."""

from __future__ import annotations

import tempfile

import pytest

from helpers import compose_run, masked_spans, samples_of
from pipeline.run.app import run

SHORT = ("rollout_batch_size=1", "rollout_max_response_len=12", "rollout_temperature=0.7")


def _check(tmp_path, metrics) -> None:
    samples = samples_of(tmp_path)
    assert len(samples) == 2
    for s in samples:
        assert s.metadata["http_turns"] >= 1 and len(s.rollout_log_probs) == s.response_length
        trainable = [lp for lp, m in zip(s.rollout_log_probs, s.loss_mask) if m]
        assert trainable and all(lp < 0.0 for lp in trainable)  # the model's own log-probs came back
        for start, n in masked_spans(s):
            assert all(s.rollout_log_probs[i] == 0.0 for i in range(start, start + n))
        assert s.weight_versions and set(s.weight_versions) == {"0"}
    assert metrics["rollout/tokens_generated"] == sum(sum(s.loss_mask) for s in samples) > 0
    assert metrics["rollout/http_requests"] == sum(s.metadata["http_turns"] for s in samples)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_hf_engine_serves_a_slime_style_generate(tmp_path):
    _check(tmp_path, run(compose_run(tmp_path, *SHORT, "engine.num_threads=1", engine="hf")))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ray_replicas_serve_a_slime_style_generate(tmp_path):
    ray_dir = tempfile.mkdtemp(prefix="ray_")
    _check(tmp_path, run(compose_run(tmp_path, *SHORT, "engine.num_replicas=2", "engine.num_cpus=2",
                                     f"engine.temp_dir={ray_dir}", engine="ray")))
