"""The endpoint in a run: a slime-style HTTP generate (tests/serving/slime_style_generate.py) runs
unchanged through `run(cfg)` against the scripted engine, its requests count in the rollout's
metrics and aborts, `engine.serve_http=false` turns it off with a clear error, and the args a
slime generate reads are set (pipeline/serving/args.py)."""

from __future__ import annotations

import pytest

from helpers import compose_run, masked_spans, samples_of
from pipeline.slime import stand_ins
from pipeline.run.app import run
from pipeline.config.args import SlimeArgs, to_plain, validate
from pipeline.config.plugins import ConfigError

stand_ins.install()  # the plugin imports slime.utils.types, as slime plugins do
from tests.serving.slime_style_generate import RETRIEVED  # noqa: E402


@pytest.mark.timeout(120)
def test_a_slime_style_http_generate_runs_multi_turn_with_retrieved_text_masked(tmp_path):
    metrics = run(compose_run(tmp_path))
    samples = samples_of(tmp_path)
    assert len(samples) == 4
    obs = len(RETRIEVED.encode())  # the scripted engine's tokenizer is bytes
    for s in samples:
        spans = masked_spans(s)
        assert len(spans) >= 1 and all(length == obs for _, length in spans), spans
        assert s.metadata["http_turns"] >= 2 and s.response.count(RETRIEVED) == len(spans)
        assert len(s.rollout_log_probs) == len(s.loss_mask) == s.response_length
        assert all(s.rollout_log_probs[i] == 0.0 for start, n in spans for i in range(start, start + n))
        assert s.weight_versions and set(s.weight_versions) == {"0"}
        assert s.reward == 1.0
    # every model token came through the endpoint and counts; retrieved tokens are not generated ones
    assert metrics["rollout/tokens_generated"] == sum(sum(s.loss_mask) for s in samples)
    assert metrics["rollout/http_requests"] == sum(s.metadata["http_turns"] for s in samples)


@pytest.mark.timeout(120)
def test_when_the_batch_fills_requests_in_flight_through_http_are_aborted(tmp_path):
    cfg = compose_run(tmp_path, "over_sampling_factor=3", "engine.token_delay=0.004", "engine.token_delay_jitter=0.03")
    metrics = run(cfg)
    assert metrics["rollout/aborted_groups_dropped"] >= 1  # surplus groups were cut mid-request, then dropped
    assert all(s.status == "completed" for s in samples_of(tmp_path))
    kept = sum(sum(s.loss_mask) for s in samples_of(tmp_path))
    assert metrics["rollout/tokens_generated"] > kept  # the aborted requests' partial tokens count too


@pytest.mark.timeout(60)
def test_serve_http_false_turns_the_endpoint_off_with_a_clear_error(tmp_path):
    with pytest.raises(AttributeError, match=r"engine.serve_http=false turns the SGLang-compatible /generate"):
        run(compose_run(tmp_path, "engine.serve_http=false"))


def _args(tmp_path, engine: str, *extra: str) -> SlimeArgs:
    return SlimeArgs.from_config(to_plain(compose_run(tmp_path, *extra, engine=engine)))


def test_the_args_a_slime_generate_reads_are_set_for_every_engine(tmp_path):
    hf = _args(tmp_path, "hf")
    assert (hf.sglang_server_concurrency, hf.rollout_num_gpus, hf.rollout_num_gpus_per_engine) == (48, 1, 1)
    assert (hf.rollout_skip_special_tokens, hf.sglang_dp_size, hf.use_distributed_post) == (False, 1, False)
    ray = _args(tmp_path, "ray", "engine.num_replicas=3")
    assert (ray.rollout_num_gpus, ray.sglang_server_concurrency) == (3, 32)  # slime: 3 engines of 32
    sg = _args(tmp_path, "sglang", "engine.base_url=http://10.0.0.7:31000", "engine.skip_special_tokens=true")
    assert (sg.sglang_router_ip, sg.sglang_router_port, sg.rollout_skip_special_tokens) == ("10.0.0.7", 31000, True)
    assert sg.sglang_endpoint.server is None  # engine=sglang: its own server is the endpoint
    own = _args(tmp_path, "scripted", "+sglang_router_port=4321", "+rollout_num_gpus=8")
    assert (own.sglang_router_port, own.rollout_num_gpus) == (4321, 8)  # a key of the run wins
    with pytest.raises(AttributeError, match="built outside one"):
        _ = _args(tmp_path, "scripted").sglang_router_ip  # no run: nothing to serve
    with pytest.raises(AttributeError, match="engine.serve_http=false"):
        _ = _args(tmp_path, "hf", "engine.serve_http=false").rollout_num_gpus
    assert getattr(_args(tmp_path, "hf", "engine.serve_http=false"), "sglang_router_ip", None) is None


@pytest.mark.parametrize("override, match", [
    ("engine.serve_http=sometimes", "engine.serve_http: expected auto, true or false, got 'sometimes'"),
    ("engine.base_url=http://host:30000/api", "engine.base_url: 'http://host:30000/api' is not http"),
])
def test_preflight_names_a_bad_serve_http_or_sglang_url(override, match, tmp_path):
    engine = "sglang" if "base_url" in override else "scripted"
    with pytest.raises(ConfigError, match=match):
        validate(compose_run(tmp_path, override, engine=engine))


def test_deterministic_mode_with_a_custom_generate_warns_how_http_requests_get_their_seed(tmp_path):
    from pipeline.config.rules import collect_warnings

    warned = [w for w in collect_warnings(to_plain(compose_run(tmp_path, "rollout.deterministic=true")))
              if "SGLang-compatible" in w]
    assert len(warned) == 1 and "sampling_params['seed']" in warned[0]
    assert not [w for w in collect_warnings(to_plain(compose_run(tmp_path, "rollout.deterministic=true",
                                                                 "engine.serve_http=false")))
                if "SGLang-compatible" in w]
