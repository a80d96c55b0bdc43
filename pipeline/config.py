"""Config plumbing: the one plugin builder, the pre-flight validator and the slime `args` view.

* `build(node, **runtime)` is the only caller of `hydra.utils.instantiate`. A node names its
  target with `_target_` (+ `_partial_` for functions) or with a dotted `path` (a function,
  treated as `_target_` + `_partial_`; with a `_target_` present, `path` is a plain keyword). Targets outside the allowlist are refused. Runtime
  keyword arguments are passed only when the target's signature accepts them.
* `validate(cfg)` checks the whole config once, before anything heavy is built.
* `SlimeArgs` is the read-only attribute namespace with slime's names handed to plugins.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = [
    "ConfigError",
    "PluginImportError",
    "TargetNotAllowedError",
    "SlimeArgs",
    "build",
    "load_object",
    "missing_arg_message",
    "to_plain",
    "validate",
]

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and what was expected."""


class TargetNotAllowedError(ConfigError):
    """A `_target_` / `path` names a module outside the allowlist."""


class PluginImportError(ImportError):
    """A dotted plugin path could not be imported; names the path and the underlying error."""


def to_plain(cfg: Any) -> Any:
    """Resolve a DictConfig/ListConfig into plain dicts and lists (safe to send to Ray / pickle)."""
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    return cfg


def _allowed_prefixes(allowed: Iterable[str] | None) -> tuple[str, ...]:
    return tuple(str(p) for p in (allowed or ()))


def check_allowed(target: str, allowed: Iterable[str], where: str = "") -> None:
    """Raise `TargetNotAllowedError` unless `target` starts with one of the allowed prefixes.

    A prefix ending with "." allows a package (`pipeline.`); one without allows that exact name
    and anything under it (`builtins.dict`).
    """
    for prefix in _allowed_prefixes(allowed):
        if prefix.endswith("."):
            if target.startswith(prefix):
                return
        elif target == prefix or target.startswith(prefix + "."):
            return
    top = target.split(".")[0]
    advice = (f"standard-library module {top!r} is not a plugin package (allowed_targets_extra is for your own "
              f"packages)" if top in sys.stdlib_module_names
              else f"if this is your own code, add its package with allowed_targets_extra=[{top}.]")
    raise TargetNotAllowedError(
        f"{where or 'plugin'}: target {target!r} is not allowed; allowed module prefixes are "
        f"{list(_allowed_prefixes(allowed))}; {advice}"
    )


def load_object(path: str, allowed: Iterable[str] | None = None, where: str = "") -> Any:
    """Import `pkg.mod.attr` (after the allowlist check when `allowed` is given)."""
    if not isinstance(path, str) or "." not in path:
        raise ConfigError(f"{where or 'plugin'}: expected a dotted path 'pkg.mod.name', got {path!r}")
    if allowed is not None:
        check_allowed(path, allowed, where)
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is the user's plugin failing
        # the path may name a nested attribute (pkg.mod.Class.method): try one level up
        if "." in module_name:
            try:
                obj = getattr(load_object(module_name, None, where), attr)
            except Exception:
                pass
            else:
                if allowed is not None:
                    _check_origin(obj, path, allowed, where)
                return obj
        raise PluginImportError(
            f"{where or 'plugin'}: cannot import {path!r}: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        obj = getattr(module, attr)
    except AttributeError as exc:
        raise PluginImportError(
            f"{where or 'plugin'}: cannot import {path!r}: module {module_name!r} has no attribute {attr!r}"
        ) from exc
    if allowed is not None:
        _check_origin(obj, path, allowed, where)
    return obj


def _check_origin(obj: Any, path: str, allowed: Iterable[str], where: str) -> None:
    """Refuse an allowed-looking path that resolves to a module, function or class defined outside
    the allowlist (`pipeline.app.os.system` is `posix.system`)."""
    if inspect.ismodule(obj):
        origin = obj.__name__
    elif callable(obj) and isinstance(getattr(obj, "__module__", None), str) and hasattr(obj, "__qualname__"):
        origin = f"{obj.__module__}.{obj.__qualname__}"
    else:
        return
    if origin != path:
        check_allowed(origin, allowed, f"{where or 'plugin'} ({path!r} resolves to {origin!r})")


def _accepted_kwargs(fn: Any, runtime: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of `runtime` that `fn` accepts by name (all of it when it takes **kwargs)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(runtime)
    return {
        k: v
        for k, v in runtime.items()
        if k in params and params[k].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def build(
    node: Any,
    *,
    allowed: Iterable[str] | None = None,
    where: str = "",
    **runtime: Any,
) -> Any:
    """Build a plugin from a config node; None / a node without a target gives None.

    `allowed`: module prefixes (`cfg.allowed_targets + cfg.allowed_targets_extra`); when None the
    default `("pipeline.",)` applies. `where` names the config key for error messages.
    `runtime`: objects injected by name when the target's signature accepts them (config keys win);
    never into `_partial_` functions, which keep their own (slime) signature.
    """
    from hydra.utils import instantiate  # the only call site in the code base

    allowed = tuple(allowed) if allowed is not None else ("pipeline.",)
    if node is None:
        return None
    if isinstance(node, (DictConfig, ListConfig)):
        node = OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    if not isinstance(node, dict):
        raise ConfigError(f"{where or 'plugin'}: expected a mapping with _target_ or path, got {node!r}")
    node = dict(node)
    # with a _target_, `path` is an ordinary keyword (e.g. the data source's data path)
    if "path" in node and "_target_" not in node:
        path = node.pop("path")
        if path is None:
            return None
        node["_target_"] = path
        node["_partial_"] = True
    target = node.get("_target_")
    if target is None:
        return None
    if not isinstance(target, str):
        raise ConfigError(f"{where}._target_: expected a dotted path string, got {target!r}")
    _check_tree(node, allowed, where)
    obj = load_object(target, allowed, where)  # clear import errors before hydra wraps them
    # functions (`_partial_`, `path`) are called later by the pipeline with their own arguments
    # (slime's `args` among them): only objects built now get runtime parts injected
    extra = {} if node.get("_partial_") else {
        k: v for k, v in _accepted_kwargs(obj, runtime).items() if k not in node}
    try:
        built = instantiate(node, _convert_="all", **extra)
    except Exception as exc:
        # hydra wraps the target's own error in an InstantiationException: name the real one
        cause = exc.__cause__ if type(exc).__name__ == "InstantiationException" and exc.__cause__ else exc
        raise ConfigError(f"{where or 'plugin'}: building {target!r} failed: {type(cause).__name__}: {cause}") from exc
    from pipeline.config_rules import check_call_signature

    check_call_signature(built, target, where)
    return built


def _check_tree(node: Any, allowed: tuple[str, ...], where: str) -> None:
    """Refuse disallowed targets anywhere in a nested node (hydra would instantiate them)."""
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str):
            load_object(target, allowed, where)  # the allowlist, also on what the path resolves to
        for key, value in node.items():
            _check_tree(value, allowed, f"{where}.{key}" if where else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_tree(value, allowed, f"{where}[{i}]")


def allowed_targets(cfg: Any) -> tuple[str, ...]:
    """The allowlist of a run config: `allowed_targets` + `allowed_targets_extra`."""
    return tuple(cfg["allowed_targets"]) + tuple(cfg["allowed_targets_extra"] or ())


# ----------------------------------------------------------------------------------- args view
# data-source keys mirrored into args under slime's names
_DATA_MIRRORS = {
    "path": "prompt_data",
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


class SlimeArgs:
    """Read-only attribute view with slime's names (docs/contracts.md §6); unknown names raise AttributeError.

    `hf_checkpoint` reads as the local model folder (a bundled model name is resolved, and
    converted once, on first access), as slime plugins load it with `from_pretrained`. Keys of
    the `slime_args:` mapping read as attributes too (run keys win).
    """

    __slots__ = ("_values", "_checkpoint")

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_checkpoint", None)

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
        ev = plain.get("eval") or {}
        datasets = ev.get("datasets") if isinstance(ev, dict) else None
        values["eval_prompt_data"] = _eval_prompt_data(datasets)
        filt = plain.get("filter") or {}
        values["buffer_filter_path"] = filt.get("_target_") or filt.get("path")
        dyn = plain.get("dynamic_filter") or {}
        values["dynamic_sampling_filter_path"] = dyn.get("_target_") or dyn.get("path")
        # slime's --disable-rollout-global-dataset is a source without a prompt file (buffer-only)
        values.setdefault("rollout_global_dataset", values.get("prompt_data") is not None)
        return cls(values)

    def __getattr__(self, name: str) -> Any:
        try:
            value = self._values[name]
        except KeyError:
            raise AttributeError(missing_arg_message(name)) from None
        if name == "hf_checkpoint" and value is not None:
            return self._checkpoint_folder(value)
        return value

    def _checkpoint_folder(self, name: Any) -> Any:
        """`hf_checkpoint` as a local folder (resolved once); the name itself when it resolves to
        nothing (a plugin loading it then fails on the name, as in slime)."""
        if self._checkpoint is None:
            from pipeline.engines.assets import CheckpointError, resolve_checkpoint

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
        return SlimeArgs({**self._values, **changes})

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"args is read-only; cannot set {name!r} (change the config instead)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"args is read-only; cannot delete {name!r}")

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def __reduce__(self) -> tuple[Any, ...]:
        return (SlimeArgs, (self._values,))

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
            f"README 'Porting from slime' lists the keys that already stand for slime flags")


def _eval_prompt_data(datasets: Any) -> list[str] | None:
    """slime's flat `[name1, path1, name2, path2, ...]` from our list of dataset nodes."""
    if not datasets:
        return None
    flat: list[str] = []
    for ds in datasets:
        if isinstance(ds, dict) and "name" in ds and "path" in ds:
            flat += [str(ds["name"]), str(ds["path"])]
    return flat or None


def validate(cfg: Any) -> None:
    """Pre-flight check of the whole config; raises ConfigError listing every problem found, and
    logs a warning for each valid but probably unintended choice (`collect_warnings`)."""
    from pipeline.config_rules import collect_problems, collect_warnings

    plain = to_plain_lenient(cfg)
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
