"""In-process checks of the slime hook plumbing: sample hooks, hook signatures, pre-flight checks,
the args view (hf_checkpoint folder, unset slime args, slime_args), custom-generate calling rules
and slime's reward dispatcher as the custom reward. The CLI runs are in tests/test_slime_hooks_cli.py."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from pipeline.config.args import ConfigError, SlimeArgs, to_plain, validate
from pipeline.config.plugins import check_call
from pipeline.rewards.dispatch import RewardDispatcher
from pipeline.rollout.contracts import PluginOutputError
from pipeline.rollout.sample_generate import call_custom_generate
from pipeline.rollout.sample_hooks import SampleHooks
from pipeline.samples.sample import Sample
from tests.plugins import slime_hooks

CONF = Path(__file__).resolve().parents[2] / "conf"


def compose_cfg(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=[
            f"paths.output_dir={tmp_path}/out", f"paths.cache_dir={tmp_path}/cache", "engine=scripted",
            "logger=jsonl", *overrides])


# ------------------------------------------------------------------ sample hooks
def test_sample_hooks_pass_only_the_keywords_a_hook_names_in_order():
    calls = []

    def named(args, sample, *, evaluation=False):
        calls.append(("named", evaluation))

    def kwargs_hook(args, sample, **kw):
        calls.append(("kw", sorted(kw.items())))

    async def replacing(args, sample):
        calls.append(("replace",))
        return Sample(index=sample.index + 100)

    hooks = SampleHooks([("m.named", named), ("m.kw", kwargs_hook), ("m.replacing", replacing)])
    nested = [Sample(index=1), [Sample(index=2), Sample(index=3)]]
    out = asyncio.run(hooks.apply(None, nested, rollout_id=7, evaluation=True))
    assert [out[0].index, [s.index for s in out[1]]] == [101, [102, 103]]  # shape kept, replaced
    assert calls[:3] == [("named", True), ("kw", [("evaluation", True), ("rollout_id", 7)]), ("replace",)]
    assert len(calls) == 9


def test_a_failing_or_misbehaving_sample_hook_is_named():
    def boom(args, sample):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError) as err:
        asyncio.run(SampleHooks([("mypkg.boom", boom)]).apply(None, Sample(index=4), rollout_id=0, evaluation=False))
    assert "rollout sample hook 'mypkg.boom'" in "".join(err.value.__notes__) and "sample 4" in "".join(err.value.__notes__)
    with pytest.raises(PluginOutputError, match="'mypkg.bad' returned dict"):
        asyncio.run(SampleHooks([("mypkg.bad", slime_hooks.bad_sample_hook)]).apply(
            None, Sample(index=0), rollout_id=0, evaluation=False))


# ------------------------------------------------------------------ signatures and pre-flight
def test_rollout_data_postprocess_accepts_both_slime_forms():
    key = "rollout_data_postprocess_path"
    check_call(slime_hooks.rollout_data_postprocess, "p.new", key)
    check_call(slime_hooks.rollout_data_postprocess_args_only, "p.old", key)
    with pytest.raises(ConfigError, match=r"fn\(args, rollout_id, rollout_data\)"):
        check_call(lambda args, rollout_id: None, "p.two", key)
    with pytest.raises(ConfigError, match=r"fn\(rollout_id, args, data, extra_metrics\) -> bool"):
        check_call(lambda rollout_id, args, data: None, "p.log", "custom_eval_rollout_log_function_path")


def test_preflight_checks_the_custom_generate_allowlist_and_hook_keys(tmp_path):
    cfg = compose_cfg(tmp_path, "rollout.custom_generate_path=os.system", "eval=engine",
                      "eval.custom_generate_path=mypkg.gen.generate",
                      "rollout_sample_hook_path=[mypkg.hooks.stamp]", "data_source_path=notdotted",
                      "+slime_args.num_rollout=3", "+slime_args.loss_mask_type=qwen")
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    msg = str(err.value)
    assert "rollout.custom_generate_path: target 'os.system' is not allowed" in msg
    assert "eval.custom_generate_path: target 'mypkg.gen.generate' is not allowed" in msg
    assert "rollout_sample_hook_path[0]: target 'mypkg.hooks.stamp' is not allowed" in msg
    assert "data_source_path: expected a dotted path" in msg
    assert "slime_args.num_rollout: num_rollout is a key of this config already" in msg
    assert "loss_mask_type" not in msg


def test_preflight_refuses_a_sample_hook_path_that_is_not_a_list(tmp_path):
    cfg = compose_cfg(tmp_path, "rollout_sample_hook_path=tests.plugins.slime_hooks.stamp_sample")
    with pytest.raises(ConfigError, match="rollout_sample_hook_path: expected a list of dotted paths"):
        validate(cfg)


# ------------------------------------------------------------------ the args view
def test_args_name_an_unset_slime_arg_and_read_slime_args_and_plus_keys(tmp_path):
    args = SlimeArgs.from_config(to_plain(compose_cfg(tmp_path, "+slime_args.loss_mask_type=qwen",
                                                      "+sglang_router_ip=10.0.0.1")))
    assert args.loss_mask_type == "qwen" and args.sglang_router_ip == "10.0.0.1"
    with pytest.raises(AttributeError) as err:
        args.use_rollout_routing_replay
    msg = str(err.value)
    assert "'use_rollout_routing_replay'" in msg and "--use-rollout-routing-replay" in msg
    assert "+use_rollout_routing_replay=<value>" in msg and "slime_args:" in msg
    assert getattr(args, "use_rollout_routing_replay", False) is False  # slime's getattr defaults work


def test_hf_checkpoint_reads_as_the_local_model_folder(tmp_path):
    converted = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    converted.mkdir(parents=True)
    (converted / ".rollout_pipeline_converted").write_text("x\n")
    args = SlimeArgs.from_config(to_plain(compose_cfg(tmp_path)))
    assert args.hf_checkpoint == str(converted)
    assert pickle.loads(pickle.dumps(args)).hf_checkpoint == str(converted)
    assert args.as_dict()["hf_checkpoint"] == "smollm2-135m-instruct"
    folder = tmp_path / "my_model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert SlimeArgs({"hf_checkpoint": str(folder)}).hf_checkpoint == str(folder.resolve())
    assert SlimeArgs({"hf_checkpoint": "org/not-here"}).hf_checkpoint == "org/not-here"


# ------------------------------------------------------------------ custom generate calls
def test_custom_generate_gets_evaluation_only_by_name_and_may_be_sync():
    params = {"max_new_tokens": 8}

    def call(fn, evaluation):
        return asyncio.run(call_custom_generate(fn, "p.gen", None, Sample(index=1, label="4"), params, evaluation))

    assert call(slime_hooks.generate_multi_turn, True).metadata["max_turns"] == 3
    assert call(slime_hooks.generate_with_evaluation, True).metadata["evaluation"] is True
    out = call(slime_hooks.generate_sync, False)
    assert out.metadata["sync"] and out.status == Sample.Status.TRUNCATED

    async def broken(args, sample, sampling_params):
        raise KeyError("x")

    with pytest.raises(KeyError) as err:
        call(broken, False)
    assert "raised by the custom generate 'p.gen' on sample 1" in "".join(err.value.__notes__)


# ------------------------------------------------------------------ slime's reward dispatcher
@pytest.mark.parametrize("make_args", [
    lambda extra: SlimeArgs({"allowed_targets": ["pipeline.", "tests."], "allowed_targets_extra": [], **extra}),
    lambda extra: SimpleNamespace(allowed_targets=["pipeline.", "tests."], allowed_targets_extra=[], **extra),
], ids=["SlimeArgs", "namespace"])
def test_slimes_dispatcher_as_the_custom_reward_grades_by_rm_type(make_args):
    path = "tests.plugins.slime_hooks.async_rm"
    args = make_args({"custom_rm_path": path, "rm_type": "boxed_math"})
    samples = [Sample(index=0, response=r"so \boxed{12}", label="12"),
               Sample(index=1, response=r"so \boxed{13}", label="12"),
               Sample(index=2, response="12 without a box", label="12"),
               Sample(index=3, response="12", label="12", metadata={"rm_type": "math"})]
    rewards = asyncio.run(RewardDispatcher(rm_type="boxed_math", custom_rm_path=path).score(args, samples))
    assert rewards == [1, 0, 0, 1]
    assert args.custom_rm_path == path  # the caller's args are untouched
