"""Config plumbing: the pre-flight validator and the slime `args` view.

* `validate(cfg)` checks the whole config once, before anything heavy is built (the rules are
  in `pipeline.config.rules`; plugins are loaded and built by `pipeline.config.plugins`).
* `SlimeArgs` is the read-only attribute namespace with slime's names handed to plugins.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from pipeline.config.rules import collect_problems, collect_warnings
from pipeline.engines.assets import CheckpointError, resolve_checkpoint
from pipeline.run.overrides import added_key_typos, command_line_overrides
from pipeline.config.plugins import ConfigError
from pipeline.serving.args import SERVED_ARGS, ServingArgs

__all__ = ["ConfigError", "SlimeArgs", "missing_arg_message", "to_plain", "to_plain_lenient", "validate"]

logger = logging.getLogger(__name__)


def to_plain(cfg: Any) -> Any:
    """Resolve a DictConfig/ListConfig into plain dicts and lists (safe to send to Ray / pickle)."""
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    return cfg


# ----------------------------------------------------------------------------------- args view
# data-source keys mirrored into args under slime's names
_DATA_MIRRORS = {
    "prompt_data": "prompt_data",
    "seed": "rollout_seed",
    "shuffle": "rollout_shuffle",
    "input_key": "input_key",
    "label_key": "label_key",
    "metadata_key": "metadata_key",
    "tool_key": "tool_key",
    "apply_chat_template": "apply_chat_template",
    "apply_chat_template_kwargs": "apply_chat_template_kwargs",
}
# reward keys mirrored into args under slime's names
_REWARD_MIRRORS = {
    "rm_type": "rm_type",
    "custom_rm_path": "custom_rm_path",
    "group_rm": "group_rm",
    "remote_url": "rm_url",
}


# trainer keys that are not slime flags of their own (the plugin target, the function path, the
# checkpoint and threads, which have their own homes)
_TRAINER_OWN_KEYS = frozenset({"_target_", "path", "hf_checkpoint", "cache_dir", "num_threads"})


class SlimeArgs:
    """Read-only attribute view with slime's names (docs/contracts.md §6); unknown names raise AttributeError.

    `hf_checkpoint` reads as the local model folder (a bundled model name is resolved, and
    converted once, on first access), as slime plugins load it with `from_pretrained`. Keys of
    the `slime_args:` mapping read as attributes too (run keys win). The SGLang endpoint's args
    (`sglang_router_ip`, `sglang_router_port`, ... `pipeline.serving.args.SERVED_ARGS`) come from
    `sglang_endpoint` when no key sets them; reading the address starts it (docs/serving.md).
    """

    __slots__ = ("_values", "_checkpoint", "_serving")

    def __init__(self, values: Mapping[str, Any], serving: ServingArgs | None = None) -> None:
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_checkpoint", None)
        object.__setattr__(self, "_serving", serving)

    @classmethod
    def from_config(cls, cfg: Any) -> SlimeArgs:
        """Build the view from a (resolved or not) run config."""
        plain = to_plain(cfg)
        values: dict[str, Any] = {k: v for k, v in plain.items() if k not in ("hydra",)}
        for key, value in (plain.get("slime_args") or {}).items():
            values.setdefault(str(key), value)
        ds = plain.get("data_source") or {}
        for src, dst in _DATA_MIRRORS.items():
            if src in ds:
                values[dst] = ds[src]
        reward = plain.get("reward") or {}
        for src, dst in _REWARD_MIRRORS.items():
            if src in reward:
                values[dst] = reward[src]
        adv = plain.get("advantage") or {}
        if "estimator" in adv:
            values["advantage_estimator"] = adv["estimator"]
        for key in ("rewards_normalization", "grpo_std_normalization", "group_mode"):
            if key in adv:
                values[key] = adv[key]
        # the trainer's keys are slime's (lr, eps_clip, use_kl_loss, ...): plugins read them too
        trainer = plain.get("trainer") or {}
        for key, value in trainer.items():
            if key not in _TRAINER_OWN_KEYS:
                values.setdefault(key, value)
        ev = plain.get("eval") or {}
        datasets = ev.get("datasets") if isinstance(ev, dict) else None
        values["eval_prompt_data"] = _eval_prompt_data(datasets)
        filt = plain.get("filter") or {}
        values["buffer_filter_path"] = filt.get("_target_") or filt.get("path")
        dyn = plain.get("dynamic_filter") or {}
        values["dynamic_sampling_filter_path"] = dyn.get("_target_") or dyn.get("path")
        # slime's --disable-rollout-global-dataset is a source without a prompt file (buffer-only)
        values.setdefault("rollout_global_dataset", values.get("prompt_data") is not None)
        return cls(values, ServingArgs.from_config(plain))

    @property
    def sglang_endpoint(self) -> ServingArgs | None:
        """The run's SGLang-compatible endpoint (pipeline/serving/args.py), None outside a run config."""
        return self._serving

    def __getattr__(self, name: str) -> Any:
        try:
            value = self._values[name]
        except KeyError:
            if self._serving is not None and name in SERVED_ARGS:
                return self._serving.value(name, self)
            raise AttributeError(missing_arg_message(name)) from None
        if name == "hf_checkpoint" and value is not None:
            return self._checkpoint_folder(value)
        return value

    def _checkpoint_folder(self, name: Any) -> Any:
        """`hf_checkpoint` as a local folder (resolved once); the name itself when it resolves to
        nothing (a plugin loading it then fails on the name, as in slime)."""
        if self._checkpoint is None:
            paths = self._values.get("paths")
            cache_dir = paths.get("cache_dir") if isinstance(paths, Mapping) else None
            try:
                folder = resolve_checkpoint(name, cache_dir)
            except CheckpointError as exc:
                logger.warning("args.hf_checkpoint stays %r: %s", name, exc)
                folder = name
            object.__setattr__(self, "_checkpoint", folder)
        return self._checkpoint

    def replace(self, **changes: Any) -> SlimeArgs:
        """A new view with some values changed (this one is left as it is)."""
        return SlimeArgs({**self._values, **changes}, self._serving)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"args is read-only; cannot set {name!r} (change the config instead)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"args is read-only; cannot delete {name!r}")

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def __reduce__(self) -> tuple[Any, ...]:
        served = self._serving.started_values() if self._serving is not None else {}
        return (SlimeArgs, ({**served, **self._values},))

    def as_dict(self) -> dict[str, Any]:
        """A copy of every value (`hf_checkpoint` as configured, not resolved)."""
        return dict(self._values)

    def __repr__(self) -> str:
        return f"SlimeArgs({len(self._values)} keys)"


def missing_arg_message(name: str) -> str:
    """What an `AttributeError` for a slime arg this config lacks says: the key and how to set it."""
    flag = "--" + name.replace("_", "-")
    return (f"args has no attribute {name!r}: it is neither a key of this config nor a slime name "
            f"mirrored from one. If your plugin reads slime's {flag}, set it on the command line "
            f"with +{name}=<value>, or in your config under slime_args: ({{{name}: <value>}}); "
            f"docs/slime.md (Porting from slime) lists the keys that already stand for slime flags")


def _eval_prompt_data(datasets: Any) -> list[str] | None:
    """slime's flat `[name1, path1, name2, path2, ...]` from our list of dataset nodes."""
    if not datasets:
        return None
    flat: list[str] = []
    for ds in datasets:
        if isinstance(ds, dict) and "name" in ds and "prompt_data" in ds:
            flat += [str(ds["name"]), str(ds["prompt_data"])]
    return flat or None


# slime's names that `args` gets from keys of other names: a `+key` one typo from these is warned
# about too (`+rollout_shufle=true` for data_source=slime's `+rollout_shuffle=true`)
_SLIME_NAMES = frozenset({*_DATA_MIRRORS.values(), *_REWARD_MIRRORS.values(), "advantage_estimator",
                          "buffer_filter_path", "dynamic_sampling_filter_path", "rollout_global_dataset",
                          "eval_prompt_data"})


def validate(cfg: Any, overrides: list[str] | None = None) -> None:
    """Pre-flight check of the whole config; raises ConfigError listing every problem found, and
    logs a warning for each valid but probably unintended choice (`collect_warnings`).

    First (the top of the run log, and the console) it warns about each `+key` of the command-line
    `overrides` (default: the running Hydra job's) that is a small edit from a known key
    (`pipeline.run.overrides.added_key_typos`): Hydra suggests `+key` for a mistyped key, and the run
    would then go on at the default."""
    plain = to_plain_lenient(cfg)
    for warning in added_key_typos(command_line_overrides() if overrides is None else overrides, plain,
                                   _SLIME_NAMES):
        logger.warning("config: %s", warning)
    problems = collect_problems(plain)
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))
    for warning in collect_warnings(plain):
        logger.warning("config: %s", warning)


def to_plain_lenient(cfg: Any) -> dict[str, Any]:
    """Resolve what resolves; `hydra:` interpolations outside a Hydra run are left out."""
    if isinstance(cfg, (DictConfig, ListConfig)):
        try:
            return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
        except Exception as exc:
            raise ConfigError(f"config does not resolve: {exc}") from exc
    return dict(cfg)
