"""pipeline.config.args: build (allowlist, runtime injection, import errors), SlimeArgs, validate."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from pipeline.config.args import ConfigError, SlimeArgs, to_plain
from pipeline.config.plugins import PluginImportError, TargetNotAllowedError, build, load_object

ALLOWED = ("pipeline.", "builtins.dict", "tests.", "functools.partial", __name__ + ".")


class Injected:
    """A native part: takes some runtime kwargs by name."""

    def __init__(self, size: int, engine=None, tokenizer=None) -> None:
        self.size, self.engine, self.tokenizer = size, engine, tokenizer


def slime_fn(args, rollout_id, data_source, evaluation=False):
    return ("called", rollout_id, evaluation)


def test_build_target_injects_only_accepted_runtime_kwargs():
    obj = build({"_target_": f"{__name__}.Injected", "size": 3}, allowed=ALLOWED,
                engine="E", tokenizer="T", reward="R", dynamic_filter="D")
    assert isinstance(obj, Injected)
    assert (obj.size, obj.engine, obj.tokenizer) == (3, "E", "T")


def test_config_keys_win_over_runtime():
    obj = build({"_target_": f"{__name__}.Injected", "size": 1, "engine": "from-config"},
                allowed=ALLOWED, engine="runtime")
    assert obj.engine == "from-config"


def test_path_node_is_a_partial_function_left_untouched():
    fn = build({"path": f"{__name__}.slime_fn"}, allowed=ALLOWED, engine="E", args="runtime-args")
    assert isinstance(fn, functools.partial)
    assert fn(None, 7, None, evaluation=True) == ("called", 7, True)


def test_path_with_extra_keys_binds_them():
    fn = build({"path": "builtins.dict", "a": 1}, allowed=ALLOWED)
    assert fn(b=2) == {"a": 1, "b": 2}


def test_null_targets_build_to_none():
    assert build(None) is None
    assert build({"path": None}) is None
    assert build(OmegaConf.create({"path": None})) is None


def test_a_node_with_both_target_and_path_is_refused():
    # `path` names a function plugin everywhere; a data source's prompt file is prompt_data
    with pytest.raises(ConfigError, match=r"data_source: both _target_ \(builtins.dict\) and path \(data.jsonl\).*prompt_data"):
        build({"_target_": "builtins.dict", "path": "data.jsonl"}, allowed=ALLOWED, where="data_source")


@pytest.mark.parametrize("target", ["os.system", "subprocess.run", "subprocess.Popen", "builtins.eval",
                                    "builtins.exec", "posix.system", "pipelinex.evil", "builtins.dictx"])
def test_disallowed_targets_refused(target):
    with pytest.raises(TargetNotAllowedError) as err:
        build({"_target_": target, "_args_": ["echo pwned"]}, allowed=ALLOWED, where="rollout")
    assert target in str(err.value) and "allowed_targets_extra" in str(err.value)
    with pytest.raises(TargetNotAllowedError):
        build({"path": target}, allowed=ALLOWED)


def test_nested_disallowed_target_refused():
    node = {"_target_": "builtins.dict", "inner": {"_target_": "os.system", "_args_": ["true"]}}
    with pytest.raises(TargetNotAllowedError, match="os.system"):
        build(node, allowed=ALLOWED, where="engine")


def test_import_error_names_path_and_cause():
    with pytest.raises(PluginImportError, match=r"tests\.nope\.mod\.fn.*ModuleNotFoundError"):
        build({"path": "tests.nope.mod.fn"}, allowed=ALLOWED, where="filter")
    with pytest.raises(PluginImportError, match="has no attribute 'missing'"):
        load_object(f"{__name__}.missing")


def test_constructor_failure_names_target():
    with pytest.raises(ConfigError, match="Injected"):
        build({"_target_": f"{__name__}.Injected"}, allowed=ALLOWED)  # size missing


def _cfg(**over):
    base = {
        "num_rollout": 3, "rollout_batch_size": 4, "n_samples_per_prompt": 2, "reward_key": None,
        "data_source": {"_target_": "pipeline.data.sources.PlainDataSource", "prompt_data": "d.jsonl", "seed": 7,
                        "shuffle": False, "input_key": "question",
                        "max_prompt_len": "${rollout_max_prompt_len}"},
        "rollout_max_prompt_len": 64,
        "reward": {"rm_type": "math", "custom_rm_path": None},
        "advantage": {"estimator": "gspo", "rewards_normalization": True, "grpo_std_normalization": False},
        "eval": {"datasets": [{"name": "m", "prompt_data": "e.jsonl"}]},
        "filter": {"path": "pipeline.data.buffer_filters.pop_first"},
        "dynamic_filter": {"path": None},
    }
    base.update(over)
    return OmegaConf.create(base)


def test_slime_args_mirrors_and_read_only():
    args = SlimeArgs.from_config(_cfg())
    assert args.rollout_batch_size == 4 and args.n_samples_per_prompt == 2
    assert (args.prompt_data, args.rollout_seed, args.rollout_shuffle) == ("d.jsonl", 7, False)
    assert args.input_key == "question" and args.rollout_max_prompt_len == 64
    assert (args.rm_type, args.advantage_estimator, args.grpo_std_normalization) == ("math", "gspo", False)
    assert args.eval_prompt_data == ["m", "e.jsonl"]
    assert args.buffer_filter_path == "pipeline.data.buffer_filters.pop_first"
    assert args.dynamic_sampling_filter_path is None
    assert getattr(args, "not_a_key", "fallback") == "fallback"
    with pytest.raises(AttributeError, match="not_a_key"):
        args.not_a_key  # noqa: B018
    with pytest.raises(AttributeError, match="read-only"):
        args.rollout_batch_size = 8
    assert isinstance(args.data_source, dict)  # group nodes stay reachable, as plain dicts


def test_to_plain_resolves():
    cfg = OmegaConf.create({"a": 1, "b": "${a}", "c": {"d": "${b}"}})
    assert to_plain(cfg) == {"a": 1, "b": 1, "c": {"d": 1}}
    assert type(to_plain(cfg)["c"]) is dict


def test_args_view_is_picklable_for_ray():
    import pickle

    args = SlimeArgs.from_config(_cfg())
    assert pickle.loads(pickle.dumps(args)).rollout_seed == 7
    assert SimpleNamespace(**args.as_dict()).prompt_data == "d.jsonl"
