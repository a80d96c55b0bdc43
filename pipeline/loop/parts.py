"""Build a run's parts from the plugin table (`pipeline.config.plugins.SLOTS`), one row at a time.

Each row's node is built in table order with the runtime parts its signature names (engine,
tokenizer, reward, args, ...); parts that are rows of their own and marked `on_demand` (the
engine, the reward, the buffer filter, the logger) are built only when something being built
takes them, so a rollout function that takes no engine never loads a model. Stages of your own
(`extra_stages`) and rows of your own (`extra_slots`) come from the config too.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any, Callable

from pipeline.config.args import SlimeArgs
from pipeline.engines.assets import load_tokenizer, resolve_checkpoint
from pipeline.config.plugins import SLOTS, ConfigError, Slot, accepted_keywords, build, check_call, load_object, target_of
from pipeline.rollout.sample_hooks import SampleHooks
from pipeline.loop.runner import Schedule
from pipeline.stages import STAGES, StageParts
from pipeline.stages.train import restore_trainer

__all__ = ["build_parts", "build_slot", "build_stages", "run_slots"]

logger = logging.getLogger(__name__)

# node keys left null that default to a folder of the run dir
_RUN_DIR_DEFAULTS = {"save_dir": "checkpoints"}


def run_slots(plain: Mapping[str, Any], allowed: tuple[str, ...] | None) -> tuple[Slot, ...]:
    """`SLOTS` plus the rows of your own the config names (`extra_slots`: `Slot` objects by path)."""
    extra = tuple(load_object(path, allowed, f"extra_slots[{i}]") for i, path in enumerate(plain["extra_slots"]))
    for i, slot in enumerate(extra):
        if not isinstance(slot, Slot):
            raise ConfigError(f"extra_slots[{i}]: {plain['extra_slots'][i]!r} is a {type(slot).__name__}; "
                              f"expected a pipeline.config.plugins.Slot")
    return SLOTS + extra


def build_slot(slot: Slot, node: Any, allowed: tuple[str, ...] | None, **runtime: Any) -> Any:
    """Build one row's `node` (an object, or a function named by `path`) with `runtime` parts."""
    if slot.kind in ("hook", "class"):
        return build({"path": node}, allowed=allowed, where=slot.where, calls=slot.calls)
    if slot.kind == "hooks":
        return SampleHooks([(path, build({"path": path}, allowed=allowed, where=slot.where, calls=slot.calls))
                            for path in node])
    built = build(node, allowed=allowed, where=slot.where, calls=slot.calls, **runtime)
    return _naming_errors(built, node, slot.where) if slot.kind == "function" else built


def _naming_errors(fn: Any, node: Any, where: str) -> Any:
    """`fn` whose exceptions carry a note naming its path, when `node` names a function plugin
    (`path: pkg.mod.fn`); built objects (`_target_`) are returned as they are."""
    if fn is None or not isinstance(node, Mapping) or "_target_" in node or not node.get("path"):
        return fn
    path = node["path"]

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            exc.add_note(f"raised by the {where} plugin {path!r}: fix it, or set {where}.path to another "
                         f"function, then resume=<run dir> from the last checkpoint")
            raise
    return call


class _Runtime:
    """The parts built so far, and the ones built when first asked for."""

    def __init__(self, plain: Mapping[str, Any], allowed: tuple[str, ...] | None, slots: tuple[Slot, ...],
                 args: SlimeArgs, run_dir: str, closers: list[Any]) -> None:
        self.plain, self.allowed, self.closers = plain, allowed, closers
        self.slots = {slot.name: slot for slot in slots}
        self.values: dict[str, Any] = {"args": args, "run_dir": run_dir}

    def get(self, name: str) -> Any:
        """The part `name`, built now when it is not yet."""
        if name not in self.values:
            if name == "tokenizer":
                self.values[name] = self._tokenizer()
            else:
                self.build(self.slots[name])
        return self.values[name]

    def _tokenizer(self) -> Any:
        """The engine's tokenizer; for engines that load theirs lazily, the one of hf_checkpoint."""
        tokenizer = getattr(self.get("engine"), "tokenizer", None)
        if tokenizer is None:
            tokenizer = load_tokenizer(resolve_checkpoint(self.plain["hf_checkpoint"], self.plain["paths"]["cache_dir"]))
        return tokenizer

    def parts_for(self, slot: Slot, node: Any) -> dict[str, Any]:
        """The runtime parts the target of `node` takes, built as needed. A part taking the engine
        reads its tokenizer from it, and a row with `tokenizer` among its `optional_parts` needs one
        only when its node sets apply_chat_template or max_prompt_len: either gets the tokenizer
        only when another part loaded it already."""
        path = target_of(node)
        target = load_object(path, self.allowed, slot.where) if isinstance(path, str) else None
        names = accepted_keywords(target, slot.parts) if target is not None else ()
        out = {}
        for name in names:
            wanted = name not in slot.optional_parts
            if name == "tokenizer" and "engine" in names:
                wanted = False
            elif name == "tokenizer" and not wanted and isinstance(node, Mapping):
                wanted = bool(node.get("apply_chat_template")) or node.get("max_prompt_len") is not None
            out[name] = self.get(name) if wanted else self.values.get(name)
        return out

    def build(self, slot: Slot) -> None:
        """Build `slot` into `values[slot.name]` (and the slot it replaces, if any)."""
        node = slot.value(self.plain)
        if slot.kind == "class":  # slime's cls(args), with slime's --save / --load: the run dir
            args, run_dir = self.values["args"], self.values["run_dir"]
            if "save" not in args:
                args = args.replace(save=run_dir, load=run_dir if self.plain["resume"] else None)
            built = build_slot(slot, node, self.allowed)(args)
            self.values[slot.name] = self.values[slot.replaces or slot.name] = built
            return
        if isinstance(node, Mapping):
            node = dict(node)
            for key, folder in _RUN_DIR_DEFAULTS.items():
                if key in node and node[key] is None:
                    node[key] = os.path.join(self.values["run_dir"], folder)
        built = build_slot(slot, node, self.allowed, **self.parts_for(slot, node))
        self.values[slot.name] = built
        if slot.on_demand and slot.kind == "object" and built is not None:
            self.closers.append(built)  # the engine, the reward: closed at the end of the run


def build_parts(plain: dict[str, Any], args: SlimeArgs, allowed: tuple[str, ...] | None, run_dir: str,
                closers: list[Any]) -> tuple[StageParts, Any, Schedule]:
    """Build every part of a run from the table: (stage parts, eval function, schedule).

    Objects with a `close()` are appended to `closers` as they are built (the caller closes
    them, also after a failure half-way)."""
    slots = run_slots(plain, allowed)
    runtime = _Runtime(plain, allowed, slots, args, run_dir, closers)
    endpoint = args.sglang_endpoint  # the SGLang-compatible /generate (pipeline/serving): its engine is the run's
    if endpoint is not None:
        endpoint.bind(lambda: runtime.get("engine"))
        closers.insert(0, endpoint)
    replaced = {slot.replaces for slot in slots if slot.replaces and slot.value(plain)}
    for slot in slots:
        if slot.on_demand or slot.name in replaced or slot.kind not in ("object", "function", "hook", "hooks", "class"):
            continue
        if slot.kind == "class" and not slot.value(plain):
            continue
        runtime.get(slot.name)
    if endpoint is not None:
        endpoint.start_if_eager()
    values = runtime.values
    data_source = values["data_source"]
    # the trainer last: its workers may share the Ray runtime the engine joined
    closers.extend(x for x in (values.get("rollout"), values.get("eval"), data_source, values.get("trainer"))
                   if x is not None)
    start = plain["start_rollout_id"]
    if plain["resume"]:
        start = _resume(data_source, run_dir)
        if values.get("trainer") is not None:  # its state of that checkpoint; the engine gets its weights
            restore_trainer(values["trainer"], values.get("engine"), run_dir, start - 1)
    plugins = {name: value for name, value in values.items() if name not in ("args", "run_dir")}
    parts = StageParts(args=args, data_source=data_source, rollout_fn=values["rollout"], run_dir=run_dir,
                       plugins=plugins)
    schedule = Schedule(start_rollout_id=start, num_rollout=plain["num_rollout"],
                        save_interval=plain["save_interval"], eval_interval=plain["eval_interval"],
                        eval_before_train=plain["eval_before_train"] and not plain["resume"],
                        train_async=plain["train_async"], max_weight_staleness=plain["max_weight_staleness"])
    return parts, values.get("eval"), schedule


def _resume(data_source: Any, run_dir: str) -> int:
    """Load the newest valid checkpoint of a resumed run; the next rollout id."""
    last = data_source.load()
    if last is None:
        save_dir = getattr(data_source, "save_dir", None) or os.path.join(run_dir, "checkpoints")
        found = sorted(os.listdir(save_dir)) if os.path.isdir(save_dir) else []
        raise FileNotFoundError(
            f"resume: no valid checkpoint in {save_dir}; expected checkpoints/rollout_<id>.json"
            + (f" (found {found}, none loadable; the warnings above say why)" if found else ""))
    logger.info("resume: %s from checkpoint %d, next rollout %d", run_dir, last, last + 1)
    return last + 1


Stage = tuple[str, Callable[..., None]]


def build_stages(plain: Mapping[str, Any], allowed: tuple[str, ...] | None) -> tuple[Stage, ...]:
    """The built-in `STAGES` with the config's `extra_stages` put in: each runs right after the
    stage its `after` names (at the end when it names none), timed as perf/stage/<name>_time."""
    stage_slot = next(slot for slot in SLOTS if slot.kind == "stages")
    stages = list(STAGES)
    for i, node in enumerate(plain[stage_slot.key]):
        where = f"{stage_slot.key}[{i}]"
        if not isinstance(node, Mapping) or not isinstance(node.get("path"), str):
            raise ConfigError(f"{where}: expected {{path: pkg.mod.fn, after: <stage>}}, got {node!r}")
        fn = load_object(node["path"], allowed, where)
        check_call(fn, node["path"], where, stage_slot.calls)
        name = node.get("name") or fn.__name__.removesuffix("_stage")
        names = [n for n, _ in stages]
        after = node.get("after")
        if after is not None and after not in names:
            raise ConfigError(f"{where}.after: {after!r} is not a stage; expected one of {names}")
        if name in names:
            raise ConfigError(f"{where}: a stage named {name!r} runs already; set {where}.name=<another name>")
        stages.insert(names.index(after) + 1 if after is not None else len(stages), (name, fn))
    return tuple(stages)
