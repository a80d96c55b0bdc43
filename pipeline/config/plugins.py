"""The plugin mechanism, on the ground floor (imports nothing from `pipeline`).

* The allowlist (`allowed_targets`), loading an object by dotted path (`load_object`), building
  a config node (`build`: `_target_` [+ `_partial_`] or a dotted `path`, which is a function)
  and "which target does this node name" (`target_of`).
* Signature inspection (`signature_of`, `accepts`, `accepted_keywords`, `positional_count`).
* `SLOTS`, the table of plugin roles (at the end of this module): one `Slot` per config
  key naming a plugin, saying how it is built, which runtime parts it may receive, and how the
  pipeline calls it. `pipeline.loop.parts.build_parts` builds the run from it and
  `pipeline.config.rules` checks the config against it.
* Declared requirements: a plugin class or function may carry `plugin_requires` (a tuple of
  `Needs`) and `plugin_provides` (a frozenset of capability names, e.g. {"buffer"}); the
  pre-flight check reads them, so a new plugin declares what it needs where it is defined.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.slime import stand_ins

__all__ = [
    "Call", "ConfigError", "Needs", "PluginImportError", "Slot", "TargetNotAllowedError",
    "accepted_keywords", "accepts", "allowed_targets", "build", "check_allowed", "check_call",
    "SLOTS", "SLOTS_BY_NAME", "load_object", "positional_count", "provided", "required", "signature_of",
    "target_of",
]


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and what was expected."""


class TargetNotAllowedError(ConfigError):
    """A `_target_` / `path` names a module outside the allowlist."""


class PluginImportError(ImportError):
    """A dotted plugin path could not be imported; names the path and the underlying error."""


# ------------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Call:
    """One way the pipeline calls a plugin: `text` for messages, the positional argument
    count(s) it passes and the keywords it passes by name."""

    text: str
    positional: tuple[int, ...]
    keywords: tuple[str, ...] = ()


@dataclass(frozen=True)
class Needs:
    """A requirement a plugin declares (`plugin_requires = (Needs(...),)`): the plugin in slot
    `slot` must provide `capability`; `hint` is the choice that does (e.g. data_source=buffered)."""

    slot: str
    capability: str
    hint: str


@dataclass(frozen=True)
class Slot:
    """One row of the plugin table.

    name: the role (the key of `StageParts.hooks` for a hook, the runtime part name for parts).
    key: the config key (dotted for nested keys: reward.custom_rm_path).
    kind: "object" (a node built now, `_target_`, with runtime parts injected), "function" (a
      node naming a function by `path`, or an object built by `_target_`, called later),
      "hook" (a top-level dotted path or null), "hooks" (a list of dotted paths), "class"
      (a dotted path to a class built as cls(args)), "settings" (a node without a plugin),
      "path" (a dotted path loaded while the run goes).
    calls: the accepted call forms of what is built (empty: not called as a whole).
    parts: runtime parts it may receive, by keyword, when its signature names them.
    label: the name used in messages when it is not the key.
    replaces: a slot this one takes the place of when set (data_source_path: data_source).
    on_demand: built only when a part being built takes it (else: built in table order).
    optional_parts: parts it gets only when they are built already or its node asks for them
      (the tokenizer of a data source: apply_chat_template / max_prompt_len).
    doc: one line for the docs.
    """

    name: str
    key: str
    kind: str
    calls: tuple[Call, ...] = ()
    parts: tuple[str, ...] = ()
    label: str = ""
    replaces: str = ""
    on_demand: bool = False
    optional_parts: tuple[str, ...] = ()
    doc: str = ""

    @property
    def where(self) -> str:
        """The name messages use for this slot."""
        return self.label or self.key

    def value(self, cfg: Mapping[str, Any]) -> Any:
        """This slot's node (or path) in the resolved config `cfg` (None when absent)."""
        node: Any = cfg
        for part in self.key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        return node


def required(obj: Any) -> tuple[Needs, ...]:
    """The requirements a plugin declares (`plugin_requires`), none when it declares none."""
    return tuple(getattr(obj, "plugin_requires", ()) or ())


def provided(obj: Any) -> frozenset[str] | None:
    """The capabilities a plugin declares (`plugin_provides`); None: it declares nothing."""
    value = getattr(obj, "plugin_provides", None)
    return None if value is None else frozenset(value)


# ------------------------------------------------------------------------------ allowlist
def allowed_targets(cfg: Any) -> tuple[str, ...] | None:
    """The allowlist of a run: `allowed_targets` + `allowed_targets_extra`, read from a config
    mapping or from the slime `args` view; None when it names none (no check)."""
    def get(key: str) -> Any:
        return cfg.get(key) if isinstance(cfg, Mapping) else getattr(cfg, key, None)

    base = get("allowed_targets")
    if base is None:
        return None
    return tuple(base) + tuple(get("allowed_targets_extra") or ())


def check_allowed(target: str, allowed: Iterable[str] | None, where: str = "") -> None:
    """Raise `TargetNotAllowedError` unless `target` starts with one of the allowed prefixes.

    A prefix ending with "." allows a package (`pipeline.`); one without allows that exact name
    and anything under it (`builtins.dict`).
    """
    prefixes = tuple(str(p) for p in (allowed or ()))
    for prefix in prefixes:
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
        f"{list(prefixes)}; {advice}"
    )


def load_object(path: str, allowed: Iterable[str] | None = None, where: str = "") -> Any:
    """Import `pkg.mod.attr` (after the allowlist check when `allowed` is given)."""
    if not isinstance(path, str) or "." not in path:
        raise ConfigError(f"{where or 'plugin'}: expected a dotted path 'pkg.mod.name', got {path!r}")
    if allowed is not None:
        check_allowed(path, allowed, where)
    module_name, _, attr = path.rpartition(".")
    stand_ins.install()  # `from slime.utils.types import Sample` in a slime plugin, without slime
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
        top = module_name.split(".")[0]
        hint = _import_hint(exc, top)
        raise PluginImportError(
            f"{where or 'plugin'}: cannot import {path!r}: {type(exc).__name__}: {exc}{hint}"
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


def _import_hint(exc: BaseException, top: str) -> str:
    """What to do about a plugin module that failed to import: its own package missing (PYTHONPATH),
    or a package one of its files imports (named with that file and line; for slime's modules, what
    slime's plugins need)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return ""
    if exc.name == top:
        return (f"; Python finds no package {top!r}: put the folder that holds it on PYTHONPATH "
                f"(PYTHONPATH=<folder> python run.py ..., also when resuming) or pip install it")
    missing = exc.name.split(".")[0]
    if missing == top or exc.name.startswith("slime.") and stand_ins.installed():
        return ""  # a module of the plugin's own package (or the stand-in's refusal, which says it all)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    origin = f"{frames[-1].filename} line {frames[-1].lineno}" if frames else f"a module of {top!r}"
    hint = (f"; {origin} imports {exc.name!r}, which is not installed in this environment: pip install {missing} "
            f"(or the distribution that provides it)")
    if top == "slime":
        hint += f"; slime's own plugins need {stand_ins.SLIME_NEEDS}"
    return hint


def _check_origin(obj: Any, path: str, allowed: Iterable[str], where: str) -> None:
    """Refuse an allowed-looking path that resolves to a module, function or class defined outside
    the allowlist (`pipeline.run.app.os.system` is `posix.system`)."""
    if inspect.ismodule(obj):
        origin = obj.__name__
    elif callable(obj) and isinstance(getattr(obj, "__module__", None), str) and hasattr(obj, "__qualname__"):
        origin = f"{obj.__module__}.{obj.__qualname__}"
    else:
        return
    if origin != path:
        check_allowed(origin, allowed, f"{where or 'plugin'} ({path!r} resolves to {origin!r})")


def target_of(node: Any) -> str | None:
    """The dotted path a config node names: its `_target_`, else its `path` (None: none)."""
    if not isinstance(node, Mapping):
        return None
    return node["_target_"] if "_target_" in node else node.get("path")


# ------------------------------------------------------------------------------ signatures
def signature_of(fn: Any) -> inspect.Signature | None:
    """`inspect.signature(fn)`, None when it has none (builtins, some C callables)."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def accepted_keywords(fn: Any, names: Iterable[str]) -> tuple[str, ...]:
    """Which of `names` `fn` accepts by keyword (all of them when it takes **kwargs)."""
    sig = signature_of(fn)
    if sig is None:
        return ()
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return tuple(names)
    return tuple(n for n in names if n in params and params[n].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))


def accepts(fn: Any, name: str) -> bool:
    """True when `fn` (a class or function; None: False) takes keyword `name` (or **kwargs)."""
    return fn is not None and bool(accepted_keywords(fn, (name,)))


def positional_count(fn: Any) -> int | None:
    """How many positional parameters `fn` takes (None: any number, or unknown)."""
    sig = signature_of(fn)
    if sig is None:
        return None
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params)


def check_call(fn: Any, target: str, where: str, calls: tuple[Call, ...] | None = None) -> None:
    """Raise ConfigError when plugin `fn` (built for `where`) cannot be called in any of the
    forms `calls` (by default: those of the `SLOTS` row `where` names); objects without a
    signature pass."""
    if calls is None:
        calls = _CALLS_BY_WHERE.get(where, ())
    if fn is None or not calls:
        return
    expected = " or ".join(c.text for c in calls)
    if not callable(fn):
        raise ConfigError(f"{where}: {target!r} built a {type(fn).__name__}, which is not callable; "
                          f"expected {expected}")
    sig = signature_of(fn)
    if sig is None:
        return
    problem: TypeError | None = None
    for call in calls:
        for n in call.positional:
            try:
                sig.bind(*([None] * n), **{k: False for k in call.keywords})
                return
            except TypeError as exc:
                problem = problem or exc
    raise ConfigError(f"{where}: {target!r} has the signature {sig}, but the pipeline calls it as "
                      f"{expected} ({problem})") from None


# ------------------------------------------------------------------------------ building
def build(node: Any, *, allowed: Iterable[str] | None = None, where: str = "",
          calls: tuple[Call, ...] = (), **runtime: Any) -> Any:
    """Build a plugin from a config node; None / a node without a target gives None.

    `allowed`: module prefixes (`allowed_targets(cfg)`); when None the default `("pipeline.",)`
    applies. `where` names the config key for error messages; `calls`, the call forms checked on
    what is built (`check_call`). `runtime`: objects injected by name when the target's signature
    accepts them (config keys win); never into `_partial_` functions, which keep their own
    (slime) signature.
    """
    from hydra.utils import instantiate  # the only call site in the code base
    from omegaconf import DictConfig, ListConfig, OmegaConf

    allowed = tuple(allowed) if allowed is not None else ("pipeline.",)
    if node is None:
        return None
    if isinstance(node, (DictConfig, ListConfig)):
        node = OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    if not isinstance(node, dict):
        raise ConfigError(f"{where or 'plugin'}: expected a mapping with _target_ or path, got {node!r}")
    node = dict(node)
    if "path" in node and "_target_" in node:
        raise ConfigError(f"{where or 'plugin'}: both _target_ ({node['_target_']}) and path ({node['path']}); "
                          f"path names a function, _target_ an object to build: keep one (a data source's "
                          f"prompt file is prompt_data)")
    if "path" in node:
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
        k: runtime[k] for k in accepted_keywords(obj, runtime) if k not in node}
    try:
        built = instantiate(node, _convert_="all", **extra)
    except Exception as exc:
        # hydra wraps the target's own error in an InstantiationException: name the real one
        cause = exc.__cause__ if type(exc).__name__ == "InstantiationException" and exc.__cause__ else exc
        raise ConfigError(f"{where or 'plugin'}: building {target!r} failed: {type(cause).__name__}: {cause}") from exc
    check_call(built, target, where, calls or None)
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


# ------------------------------------------------------------------------------ the rows
_ARGS = ("args",)
_ROLLOUT_PARTS = ("engine", "reward", "dynamic_filter", "tokenizer", "args", "run_dir", "sample_hooks")


def _hook(name: str, key: str, *calls: Call, doc: str) -> Slot:
    return Slot(name=name, key=key, kind="hook", calls=calls, doc=doc)


# one row per plugin role, in build order (a row's runtime parts are built before it, lazily:
# the engine, tokenizer and reward only when a part that is built takes them)
SLOTS: tuple[Slot, ...] = (
    Slot("engine", "engine", "object", on_demand=True, doc="the inference engine (generate, tokenizer); built when a part takes it"),
    Slot("buffer_filter", "filter", "function", (Call("fn(args, rollout_id, buffer, num_samples) -> list[list[Sample]]", (4,)),),
         on_demand=True, doc="which buffered groups a data source hands out first"),
    Slot("data_source", "data_source", "object", parts=("args", "tokenizer", "buffer_filter"), optional_parts=("tokenizer",),
         doc="prompt groups (get_samples, add_samples, save, load)"),
    Slot("data_source_path", "data_source_path", "class",
         (Call("cls(args) -> a data source (get_samples, add_samples, save, load)", (1,)),), replaces="data_source",
         doc="slime's --data-source-path: a data source class built as cls(args)"),
    Slot("reward", "reward", "object", on_demand=True, doc="scores samples (score(args, samples)); built when a part takes it"),
    Slot("dynamic_filter", "dynamic_filter", "function", (Call("fn(args, samples) -> DynamicFilterOutput | bool", (2,)),),
         doc="keeps or drops a finished group"),
    Slot("sample_hooks", "rollout_sample_hook_path", "hooks",
         (Call("fn(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None", (2,)),),
         doc="per-sample post-processing in the default rollout and eval"),
    Slot("rollout", "rollout", "function",
         (Call("fn(args, rollout_id, data_source, evaluation=False) -> RolloutFnTrainOutput", (3,), ("evaluation",)),),
         parts=_ROLLOUT_PARTS, doc="generates one rollout's groups"),
    Slot("eval", "eval", "function",
         (Call("fn(args, rollout_id, data_source, evaluation=True) -> RolloutFnEvalOutput", (3,), ("evaluation",)),),
         parts=_ROLLOUT_PARTS, doc="evaluation every eval_interval rollouts"),
    Slot("custom_generate", "rollout.custom_generate_path", "path",
         (Call("async fn(args, sample, sampling_params[, evaluation]) -> Sample | list[Sample]", (3,)),),
         label="custom generate (generate_function_path)", doc="generates one sample (also eval.custom_generate_path)"),
    Slot("agent_tool", "rollout.agent.tools", "path", (Call("fn(**arguments) -> str | JSON value, sync or async", (0,)),),
         label="agent tool (rollout.agent.tools)",
         doc="a tool of the agent loop (rollout.generate=agent; also eval.agent.tools): fn(**arguments) -> "
             "str | JSON value, sync or async, or a class built with tool_args.<name>"),
    Slot("custom_rm", "reward.custom_rm_path", "path",
         (Call("fn(args, sample) -> reward (or fn(args, samples) with group_rm)", (2,)),),
         label="reward function (custom_rm_path)", doc="a reward function in place of rm_type"),
    Slot("advantage", "advantage", "settings", doc="the advantage estimator's settings, read by the rewards stage"),
    Slot("logger", "logger", "object", on_demand=True, doc="the metrics sink (start, log, finish)"),
    Slot("trainer", "trainer", "object", parts=_ARGS,
         doc="updates the policy from each rollout's train data (train, weight_version, weights_for_engine, save, load)"),
    _hook("reward_post_process", "custom_reward_post_process_path",
          Call("fn(args, samples) -> (raw_rewards, rewards)", (2,)), doc="replaces reward post-processing"),
    _hook("convert_to_train_data", "custom_convert_samples_to_train_data_path",
          Call("fn(args, samples) -> dict", (2,)), doc="replaces conversion to train data"),
    _hook("rollout_sample_filter", "rollout_sample_filter_path",
          Call("fn(args, groups) -> None", (2,)), doc="sets sample.remove_sample"),
    _hook("rollout_log", "custom_rollout_log_function_path",
          Call("fn(rollout_id, args, samples, extra_metrics, rollout_time) -> bool", (5,)),
          doc="rollout metrics; True skips the default ones"),
    _hook("all_samples_process", "rollout_all_samples_process_path",
          Call("fn(args, all_samples, data_source) -> None", (3,)), doc="every group the rollout decided on"),
    _hook("eval_rollout_log", "custom_eval_rollout_log_function_path",
          Call("fn(rollout_id, args, data, extra_metrics) -> bool", (4,)),
          doc="eval metrics; True skips the default ones"),
    _hook("rollout_data_postprocess", "rollout_data_postprocess_path",
          Call("fn(args, rollout_id, rollout_data) -> None", (3,)), Call("fn(args)", (1,)),
          doc="edits the train data before it is written"),
    Slot("stage", "extra_stages", "stages", (Call("fn(ctx, parts) -> None", (2,)),),
         doc="per-rollout stages of your own, after the built-in stage each names"),
    Slot("slot", "extra_slots", "slots", doc="rows of your own (pipeline.config.plugins.Slot objects by dotted path)"),
)

SLOTS_BY_NAME: dict[str, Slot] = {slot.name: slot for slot in SLOTS}
_CALLS_BY_WHERE: dict[str, tuple[Call, ...]] = {slot.where: slot.calls for slot in SLOTS if slot.calls}
