"""The rules behind `pipeline.config.args.validate`: one pass over the resolved config.

Each rule appends a message naming the key, the value found and what was expected; the caller
raises them all at once so a user fixes a config in one go.
"""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Any

from pipeline.agent.preflight import agent_problems
from pipeline.engines.preflight import engine_device_problems, trainer_engine_problems
from pipeline.rewards.estimators import ESTIMATORS, GROUP_MODES, MEAN_SUBTRACTING
from pipeline.process.malloc import keep_freed_memory_problem
from pipeline.process.openmp import spin_count_problem
from pipeline.config.plugins import (SLOTS, SLOTS_BY_NAME, ConfigError, Needs, check_allowed, check_call, load_object,
                              provided, required)
from pipeline.config.plugins import target_of as _target
from pipeline.rewards.preflight import reward_problems
from pipeline.serving.preflight import serving_problems, serving_warnings
from pipeline.run.session import resume_target_problem
from pipeline.train.preflight import async_problems, async_warnings, trainer_problems, trainer_warnings

__all__ = ["collect_problems", "collect_warnings"]

logger = logging.getLogger(__name__)

_SLICE = re.compile(r"@\[[^\]]*\]$")
# the folder holding conf/, data/ and run.py
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_POSITIVE_INTS = ("num_rollout", "rollout_batch_size", "n_samples_per_prompt", "over_sampling_batch_size",
                  "rollout_max_response_len", "n_samples_per_eval_prompt")
_BOOLS = ("partial_rollout", "mask_offpolicy_in_partial_rollout", "eval_before_train", "continue_sweep")
# data_source.<key>: the top-level key it interpolates (its one home)
_FROM_TOP_LEVEL = {"n_samples_per_prompt": "n_samples_per_prompt", "max_prompt_len": "rollout_max_prompt_len"}
# top-level keys naming one plugin by dotted path (or null), and lists of them (slime: the flag may repeat)
_PATH_KEYS = tuple(slot.key for slot in SLOTS if slot.kind in ("hook", "class"))
_PATH_LIST_KEYS = tuple(slot.key for slot in SLOTS if slot.kind == "hooks")
# flags that need a capability of a plugin when true: (needs, why)
_FLAG_NEEDS = {"partial_rollout": (Needs("data_source", "buffer", "data_source=buffered"),
                                   "unfinished groups go back to the buffer")}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _missing(node: Any, prefix: str, out: list[str]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _missing(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _missing(v, f"{prefix}[{i}]", out)
    elif node == "???":
        out.append(f"{prefix}: a value is required (it is ??? in the config); set {prefix}=...")


def collect_problems(cfg: dict[str, Any]) -> list[str]:
    """Every problem found in the resolved run config `cfg` (empty when it is valid)."""
    out: list[str] = []
    _missing({k: v for k, v in cfg.items() if k != "hydra"}, "", out)
    _sizes(cfg, out)
    _cross_group(cfg, out)
    _data_path(cfg, out)
    _advantage(cfg, out)
    out += engine_device_problems(cfg)
    out += serving_problems(cfg)
    out += trainer_problems(cfg)
    out += async_problems(cfg)
    _plugins(cfg, out)
    _allowlist(cfg, out)
    if not out:  # imports the plugins and reads the prompt files: only when sound
        _requirements(cfg, out)
        _per_sample_functions(cfg, out)
        out += agent_problems(cfg)  # rollout.generate=agent: settings, tools (imported), prompts
    if not out:
        out += reward_problems(cfg)
        out += trainer_engine_problems(cfg)  # an engine that cannot follow the trainer
    return out


def _plugin(cfg: dict[str, Any], slot_name: str) -> tuple[str, Any] | None:
    """(config key, loaded object) of the plugin in slot `slot_name` (the slot replacing it when
    set); None when it names none or does not import (building it reports that)."""
    slot = SLOTS_BY_NAME[slot_name]
    for other in SLOTS:
        if other.replaces == slot_name and other.value(cfg):
            slot = other
    value = slot.value(cfg)
    path = value if isinstance(value, str) else _target(value)
    if not isinstance(path, str):
        return None
    try:
        return slot.key, load_object(path, _allowed(cfg), slot.where)
    except Exception:  # noqa: BLE001 - building it reports the real problem
        return None


def _provides(cfg: dict[str, Any], slot_name: str, capability: str) -> bool | None:
    """Whether the plugin in slot `slot_name` provides `capability` (None: it declares nothing)."""
    found = _plugin(cfg, slot_name)
    capabilities = provided(found[1]) if found is not None else None
    return None if capabilities is None else capability in capabilities


def _lacks(cfg: dict[str, Any], needs: Needs) -> str | None:
    """The plugin path that declares it does not provide `needs.capability` (None: it does,
    or it declares nothing)."""
    found = _plugin(cfg, needs.slot)
    if found is None:
        return None
    capabilities = provided(found[1])
    if capabilities is None or needs.capability in capabilities:
        return None
    value = SLOTS_BY_NAME[needs.slot].value(cfg)
    return f"{getattr(found[1], '__module__', '?')}.{getattr(found[1], '__qualname__', '?')}" if value is None else (
        value if isinstance(value, str) else str(_target(value)))


def _requirements(cfg: dict[str, Any], out: list[str]) -> None:
    """What plugins declare they need (`plugin_requires`), and what flags set to true need, is
    provided by the plugins chosen (`plugin_provides`)."""
    for slot in SLOTS:
        found = _plugin(cfg, slot.name) if slot.kind in ("object", "function", "class") else None
        for needs in required(found[1]) if found else ():
            lacking = _lacks(cfg, needs)
            if lacking is not None:
                path = _target(slot.value(cfg)) or slot.value(cfg)
                out.append(f"{found[0]}: {path!r} needs a {needs.capability}, but the {needs.slot} {lacking!r} "
                           f"has none; use {needs.hint}")
    for flag, (needs, why) in _FLAG_NEEDS.items():
        lacking = _lacks(cfg, needs) if cfg.get(flag) is True else None
        if lacking is not None:
            out.append(f"{flag}: true needs {needs.hint} ({why}); the {needs.slot} {lacking!r} has no "
                       f"{needs.capability}")


def _allowed(cfg: dict[str, Any]) -> list[str]:
    """The allowlist as far as it is well-formed (its own rule reports the rest)."""
    return [x for key in ("allowed_targets", "allowed_targets_extra")
            for x in (cfg.get(key) if isinstance(cfg.get(key), list) else [])]


def collect_warnings(cfg: dict[str, Any]) -> list[str]:
    """Valid but probably unintended choices in `cfg` (logged by `validate`, not refused)."""
    out: list[str] = []
    _buffer_never_filled(cfg, out)
    _baseline_eval_replaced(cfg, out)
    out += async_warnings(cfg)
    out += trainer_warnings(cfg)
    out += serving_warnings(cfg)
    return out


def _baseline_eval_replaced(cfg: dict[str, Any], out: list[str]) -> None:
    """eval_before_train with eval_interval=1: the baseline and the first scheduled eval share
    the first rollout's metrics line, and the later one replaces the baseline."""
    if cfg.get("eval_before_train") is True and cfg.get("eval_interval") == 1 and not cfg.get("resume"):
        out.append("eval_before_train: true with eval_interval=1: the eval before the first update and the one "
                   "after the first rollout both go into that rollout's metrics, and the second replaces the "
                   "first; use eval_interval >= 2 to keep the baseline")


def _buffer_never_filled(cfg: dict[str, Any], out: list[str]) -> None:
    """A buffered source under the engine rollout that nothing can ever put a group into."""
    if _provides(cfg, "data_source", "buffer") is not True:
        return
    rollout = cfg.get("rollout")
    if not str(_target(rollout) or "").endswith("EngineRollout") or cfg.get("partial_rollout") is True:
        return  # a rollout function of its own may call add_samples; partial rollouts fill it
    rbs, osb = cfg.get("rollout_batch_size"), cfg.get("over_sampling_batch_size")
    adaptive = rollout.get("over_sampling") == "adaptive"
    no_surplus = _target(cfg.get("dynamic_filter")) is None and (
        adaptive or (_is_int(rbs) and _is_int(osb) and osb <= rbs))
    if rollout.get("carry_surplus") is False or no_surplus:
        sizing = "rollout.over_sampling=adaptive" if adaptive else f"over_sampling_batch_size={osb} = rollout_batch_size"
        why = ("rollout.carry_surplus=false" if rollout.get("carry_surplus") is False else
               f"{sizing} and dynamic_filter=none: every round fetches just what the batch is missing "
               f"and keeps all of it")
        out.append(f"data_source=buffered, but nothing will ever enter the buffer ({why}; "
                   f"partial_rollout=false): the buffer filter has nothing to serve. Over-sample "
                   f"(over_sampling_factor > 1 or over_sampling_batch_size > "
                   f"rollout_batch_size), pick a dynamic filter, or set partial_rollout=true")


def _advantage(cfg: dict[str, Any], out: list[str]) -> None:
    adv = cfg.get("advantage")
    if not isinstance(adv, dict):
        out.append("advantage: expected a node with estimator, rewards_normalization, grpo_std_normalization, group_mode")
        return
    if adv.get("estimator") not in ESTIMATORS:
        out.append(f"advantage.estimator: expected one of {sorted(ESTIMATORS)}, got {adv.get('estimator')!r}")
    if adv.get("group_mode") not in GROUP_MODES:
        out.append(f"advantage.group_mode: expected one of {sorted(GROUP_MODES)}, got {adv.get('group_mode')!r}")
    for key in ("rewards_normalization", "grpo_std_normalization"):
        if not isinstance(adv.get(key), bool):
            out.append(f"advantage.{key}: expected true or false, got {adv.get(key)!r}")
    n = cfg.get("n_samples_per_prompt")
    if adv.get("estimator") == "rloo" and adv.get("rewards_normalization") is True and _is_int(n) and n < 2:
        out.append(f"advantage=rloo needs n_samples_per_prompt >= 2 (a leave-one-out baseline), got {n}")
    elif adv.get("estimator") in MEAN_SUBTRACTING and adv.get("rewards_normalization") is True and n == 1:
        logger.warning("n_samples_per_prompt=1 with advantage.estimator=%s: every prompt is a group of one "
                       "sample, so every advantage is 0 and nothing is learnt (unless a custom generate fans "
                       "out into uneven groups); use n_samples_per_prompt >= 2, advantage=reinforce_plus_plus "
                       "or advantage.rewards_normalization=false", adv.get("estimator"))


def _follows_a_bad_batch_size(cfg: dict[str, Any]) -> bool:
    """True when over_sampling_batch_size is the default rollout_batch_size x over_sampling_factor of
    a rollout_batch_size that is itself refused: one error (on rollout_batch_size), not two."""
    rbs, osb, factor = cfg.get("rollout_batch_size"), cfg.get("over_sampling_batch_size"), cfg.get("over_sampling_factor")
    if _is_int(rbs) and rbs > 0:
        return False
    if isinstance(osb, str):  # the resolver's "(not numbers)" text of a non-number
        return True
    return _is_num(rbs) and _is_num(factor) and _is_num(osb) and osb == math.ceil(rbs * factor)


def _sizes(cfg: dict[str, Any], out: list[str]) -> None:
    for key in _POSITIVE_INTS:
        v = cfg.get(key)
        if key == "over_sampling_batch_size" and _follows_a_bad_batch_size(cfg):
            continue
        if not _is_int(v) or v <= 0:
            out.append(f"{key}: expected a positive integer, got {v!r}")
    start = cfg.get("start_rollout_id")
    if not _is_int(start) or start < 0:
        out.append(f"start_rollout_id: expected an integer >= 0, got {start!r}")
    elif _is_int(cfg.get("num_rollout")) and start >= cfg["num_rollout"]:
        out.append(f"start_rollout_id: {start} must be < num_rollout ({cfg['num_rollout']}); nothing would run")
    rbs, osb = cfg.get("rollout_batch_size"), cfg.get("over_sampling_batch_size")
    if _is_int(rbs) and _is_int(osb) and 0 < osb < rbs:
        out.append(f"over_sampling_batch_size: {osb} must be >= rollout_batch_size ({rbs})")
    factor = cfg.get("over_sampling_factor")
    if not _is_num(factor) or factor < 1:
        out.append(f"over_sampling_factor: expected a number >= 1, got {factor!r}")
    for key in _BOOLS:
        if not isinstance(cfg.get(key), bool):
            out.append(f"{key}: expected true or false, got {cfg.get(key)!r}")
    for key in ("save_interval", "eval_interval"):
        v = cfg.get(key)
        if v is not None and (not _is_int(v) or v <= 0):
            out.append(f"{key}: expected a positive integer or null, got {v!r}")
    t = cfg.get("rollout_temperature")
    if not _is_num(t) or t < 0:
        out.append(f"rollout_temperature: expected a number >= 0, got {t!r}")
    p = cfg.get("rollout_top_p")
    if not _is_num(p) or not 0 < p <= 1:
        out.append(f"rollout_top_p: expected a number in (0, 1], got {p!r}")
    k = cfg.get("rollout_top_k")
    if not _is_int(k):
        out.append(f"rollout_top_k: expected an integer (-1 for no cut), got {k!r}")
    spin = spin_count_problem(cfg.get("omp_spin_count"))
    out.extend([spin] if spin else [])
    kept = keep_freed_memory_problem(cfg.get("keep_freed_memory"))
    out.extend([kept] if kept else [])
    if not _is_int(cfg.get("seed")):
        out.append(f"seed: expected an integer, got {cfg.get('seed')!r}")


def _cross_group(cfg: dict[str, Any], out: list[str]) -> None:
    ds = cfg.get("data_source") or {}
    if cfg.get("mask_offpolicy_in_partial_rollout") is True and cfg.get("partial_rollout") is False:
        out.append("mask_offpolicy_in_partial_rollout: true has no effect without partial_rollout: true")
    # data-source keys whose one home is a top-level key (the node interpolates it; slime plugins read it)
    for key, home in _FROM_TOP_LEVEL.items():
        if isinstance(ds, dict) and key in ds and home in cfg and ds[key] != cfg[home]:
            out.append(f"data_source.{key}: {ds[key]!r} differs from {home} ({cfg[home]!r}); set {home} "
                       f"instead and leave data_source.{key} as ${{{home}}}")
    has_eval = _target(cfg.get("eval")) is not None
    if cfg.get("eval_interval") is not None and not has_eval:
        out.append(f"eval_interval: {cfg['eval_interval']} is set but eval=none; choose an eval option "
                   f"(eval=engine) or set eval_interval=null")
    if cfg.get("eval_before_train") is True and not has_eval:
        out.append("eval_before_train: true but eval=none; choose an eval option (eval=engine)")
    if cfg.get("resume") is not None:
        problem = resume_target_problem(str(cfg["resume"]))
        out.extend([problem] if problem else [])


def _buffer_only(cfg: dict[str, Any], ds: dict[str, Any], out: list[str]) -> bool:
    """True when the source has no prompt file (checked here); a buffer-only source needs a
    rollout that fills the samples itself, the plain one cannot be buffer-only."""
    target = str(_target(ds) or "")
    if "prompt_data" in ds:
        if ds["prompt_data"] is not None:
            return False
    elif _provides(cfg, "data_source", "buffer") is not True or cfg.get("prompt_data") is not None:
        return False  # built from args (data_source=slime) with +prompt_data, or another class
    if _provides(cfg, "data_source", "buffer") is False:
        out.append("data_source.prompt_data: null, but the plain source needs a prompt file; for a buffer-only "
                   "source (slime's --disable-rollout-global-dataset) use data_source=buffered")
        return True
    rollout = str(_target(cfg.get("rollout")) or "")
    if rollout.startswith(("pipeline.rollout.engine_rollout.", "pipeline.rollout.sft.")):
        out.append(f"data_source: no prompt file (buffer-only, slime's --disable-rollout-global-dataset), so "
                   f"{rollout.rsplit('.', 1)[-1]} would get empty prompts; use a rollout function that fills "
                   f"the samples (rollout=function rollout.path=...) or set data_source.prompt_data")
    return True


def _from_elsewhere(path: str) -> str:
    """A hint when a relative `path` exists in the project folder but the command runs elsewhere
    (`paths.root_dir` is `.` unless PROJECT_ROOT is set)."""
    if os.path.isabs(path) or not os.path.exists(os.path.join(_PROJECT_ROOT, path)):
        return ""
    return (f"; it is in the project folder {_PROJECT_ROOT}: run from there (cd {_PROJECT_ROOT}) or set "
            f"PROJECT_ROOT={_PROJECT_ROOT}")


def _data_path(cfg: dict[str, Any], out: list[str]) -> None:
    ds = cfg.get("data_source")
    if not isinstance(ds, dict) or _buffer_only(cfg, ds, out) or "prompt_data" not in ds:
        return
    if "seed" in ds and not _is_int(ds["seed"]):
        out.append(f"data_source.seed: expected an integer, got {ds['seed']!r}")
    if "shuffle" in ds and not isinstance(ds["shuffle"], bool):
        out.append(f"data_source.shuffle: expected true or false, got {ds['shuffle']!r}")
    paths = ds["prompt_data"] if isinstance(ds["prompt_data"], list) else [ds["prompt_data"]]
    for p in paths:
        if not isinstance(p, str) or not p:
            out.append(f"data_source.prompt_data: expected a file path string, got {p!r}")
            continue
        bare = _SLICE.sub("", p)
        if not os.path.exists(bare):
            out.append(f"data_source.prompt_data: {bare!r} does not exist (cwd {os.getcwd()}); expected a "
                       f".jsonl/.parquet/.json file or a datasets folder{_from_elsewhere(bare)}")
    ev = cfg.get("eval")
    datasets = ev.get("datasets") if isinstance(ev, dict) else None
    for i, d in enumerate(datasets if isinstance(datasets, list) else []):
        # `path`: the earlier spelling, still read (with a warning) by EngineEval
        key = "prompt_data" if isinstance(d, dict) and "prompt_data" in d else "path"
        p = d.get(key) if isinstance(d, dict) else None
        if isinstance(p, str) and not os.path.exists(_SLICE.sub("", p)):
            out.append(f"eval.datasets[{i}].{key}: {p!r} does not exist; expected an eval prompt file"
                       f"{_from_elsewhere(_SLICE.sub('', p))}")


def _plugins(cfg: dict[str, Any], out: list[str]) -> None:
    for key in ("allowed_targets", "allowed_targets_extra"):
        v = cfg.get(key)
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            out.append(f"{key}: expected a list of module prefixes like [mypkg.], got {v!r}")
    for key in _PATH_KEYS:
        v = cfg.get(key)
        if v is not None and (not isinstance(v, str) or "." not in v):
            out.append(f"{key}: expected a dotted path 'pkg.mod.fn' or null, got {v!r}")
    for key in _PATH_LIST_KEYS + ("extra_slots",):
        hooks = cfg.get(key)
        if not isinstance(hooks, list) or not all(isinstance(x, str) and "." in x for x in hooks):
            out.append(f"{key}: expected a list of dotted paths like [pkg.mod.fn] ([] for none), got {hooks!r}")
    extra = cfg.get("slime_args")
    if not isinstance(extra, dict):
        out.append(f"slime_args: expected a mapping of slime arg names to values ({{}} for none), got {extra!r}")
    else:
        for key in sorted(set(extra) & (set(cfg) - {"slime_args"})):
            out.append(f"slime_args.{key}: {key} is a key of this config already; set {key}=... instead")
    lg = cfg.get("logger")
    if isinstance(lg, dict) and "mode" in lg and lg["mode"] not in ("offline", "online", "disabled"):
        out.append(f"logger.mode: expected offline, online or disabled, got {lg['mode']!r}")
    for group in ("rollout", "data_source", "logger"):
        if _target(cfg.get(group)) is None:
            out.append(f"{group}: the node has no _target_ or path; choose an option ({group}=...)")


def _targets_to_check(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """(config key, dotted path) of every plugin the config names (`hydra` left out)."""
    found: list[tuple[str, str]] = []

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("_target_"), str):
                found.append((f"{key}._target_", node["_target_"]))
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}[{i}]")

    walk({k: v for k, v in cfg.items() if k != "hydra"}, "")
    for group, node in cfg.items():  # top-level groups named by `path` (functions)
        if isinstance(node, dict) and "_target_" not in node and isinstance(node.get("path"), str):
            found.append((f"{group}.path", node["path"]))
    for key in _PATH_KEYS:
        if isinstance(cfg.get(key), str):
            found.append((key, cfg[key]))
    for key in _PATH_LIST_KEYS + ("extra_slots",):
        paths = cfg.get(key)
        for i, path in enumerate(paths if isinstance(paths, list) else []):
            if isinstance(path, str):
                found.append((f"{key}[{i}]", path))
    stages = cfg.get("extra_stages")
    for i, node in enumerate(stages if isinstance(stages, list) else []):
        if isinstance(node, dict) and isinstance(node.get("path"), str):
            found.append((f"extra_stages[{i}].path", node["path"]))
    for group in ("rollout", "eval"):  # custom generate functions, imported during generation
        node = cfg.get(group)
        if isinstance(node, dict) and isinstance(node.get("custom_generate_path"), str):
            found.append((f"{group}.custom_generate_path", node["custom_generate_path"]))
    reward = cfg.get("reward")
    if isinstance(reward, dict) and isinstance(reward.get("custom_rm_path"), str) and reward["custom_rm_path"] != "???":
        found.append(("reward.custom_rm_path", reward["custom_rm_path"]))
    return found


def _per_sample_functions(cfg: dict[str, Any], out: list[str]) -> None:
    """The functions the rollout imports on first use (a custom generate, a reward function) import
    and take their calls now, not at the first sample of the first rollout (of a resume, too)."""
    for group, key, slot_name in (("rollout", "custom_generate_path", "custom_generate"),
                                  ("eval", "custom_generate_path", "custom_generate"),
                                  ("reward", "custom_rm_path", "custom_rm")):
        node = cfg.get(group)
        path = node.get(key) if isinstance(node, dict) else None
        if not isinstance(path, str) or path in ("", "???"):
            continue
        slot = SLOTS_BY_NAME[slot_name]
        try:
            check_call(load_object(path, _allowed(cfg), slot.where), path, slot.where, slot.calls)
        except (ConfigError, ImportError) as exc:
            out.append(f"{group}.{key}: {exc}")


def _allowlist(cfg: dict[str, Any], out: list[str]) -> None:
    """Every named plugin is inside the `_target_` allowlist (checked before anything is imported)."""
    allowed = _allowed(cfg)
    for key, target in _targets_to_check(cfg):
        try:
            check_allowed(target, allowed, key)
        except ConfigError as exc:
            out.append(str(exc))
