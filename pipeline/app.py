"""The testable entry point: validate the config, build the parts, run the pipeline.

`run(cfg)` is what `run.py` calls under `@hydra.main`; tests call it with a composed config.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import signal
import threading
from typing import Any

from omegaconf import DictConfig

from pipeline import run_lock
from pipeline.config import ConfigError, SlimeArgs, allowed_targets, build, load_object, to_plain, validate
from pipeline.logging_setup import RunProgress, configure_console, progress_logger
from pipeline.rollout.sample_hooks import SampleHooks
from pipeline.run_record import check_resume_config, read_changes, read_record
from pipeline.runner import Pipeline, Schedule
from pipeline.session import discard_session_files, interrupt_hint, store_record
from pipeline.sinks.jsonl import MetricsJsonl
from pipeline.stages import StageParts

__all__ = ["run", "run_identity"]

logger = logging.getLogger(__name__)

# top-level slime hook keys -> StageParts field (rollout_sample_hook_path and data_source_path
# are built in _build: the hooks go to the rollout and eval, the class replaces the data source)
_HOOKS = {
    "custom_reward_post_process_path": "reward_post_process",
    "custom_convert_samples_to_train_data_path": "convert_to_train_data",
    "rollout_sample_filter_path": "rollout_sample_filter",
    "custom_rollout_log_function_path": "rollout_log",
    "rollout_all_samples_process_path": "all_samples_process",
    "custom_eval_rollout_log_function_path": "eval_rollout_log",
    "rollout_data_postprocess_path": "rollout_data_postprocess",
}


def run_identity(plain: dict[str, Any]) -> tuple[str, str | None]:
    """(run name, wandb group): a single run is named after its run dir plus the command-line
    overrides; a sweep job after its overrides, grouped by the sweep folder name."""
    run_dir_name = os.path.basename(os.path.normpath(plain["paths"]["output_dir"]))
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return run_dir_name, None
    if hc.mode == RunMode.MULTIRUN:
        return hc.job.override_dirname or hc.job.name, os.path.basename(os.path.normpath(hc.sweep.dir))
    return " ".join(filter(None, (run_dir_name, hc.job.override_dirname))), None


def _target_of(node: Any, allowed: tuple[str, ...], where: str) -> Any:
    """The class or function a node names (None when it names nothing); allowlist checked first."""
    if not isinstance(node, dict):
        return None
    path = node["_target_"] if "_target_" in node else node.get("path")
    return load_object(path, allowed, where) if path else None


def _accepts(obj: Any, name: str) -> bool:
    if obj is None:
        return False
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def run(cfg: DictConfig) -> dict[str, Any]:
    """Validate `cfg`, build every part, run the rollouts; returns the last step's metrics.

    A resume is checked against the run's stored config first (`pipeline.run_record`); the run
    dir is locked while the run writes into it (`pipeline.run_lock`). A pre-flight error leaves
    nothing behind; Ctrl-C ends with exit code 130 and the command that resumes the run.
    """
    configure_console()
    try:
        validate(cfg)
        plain = to_plain(cfg)
        plain.pop("hydra", None)
        resume = plain["resume"]
        run_dir = os.path.abspath(resume or plain["paths"]["output_dir"])
        record = read_record(run_dir) if resume else None
        changes = check_resume_config((record or {}).get("config"), plain, run_dir) if resume else {}
    except ConfigError:
        discard_session_files(resumed=bool(cfg.get("resume")))
        raise
    os.makedirs(run_dir, exist_ok=True)
    run_lock.acquire(run_dir)
    main_thread = threading.current_thread() is threading.main_thread()
    on_interrupt = signal.getsignal(signal.SIGINT) if main_thread else None
    try:
        return _run_locked(plain, run_dir, record, changes)
    except KeyboardInterrupt:
        logger.warning("%s", interrupt_hint(run_dir))
        raise SystemExit(130) from None
    finally:
        run_lock.release(run_dir)
        if main_thread:
            signal.signal(signal.SIGINT, on_interrupt)


def _run_locked(plain: dict[str, Any], run_dir: str, record: dict[str, Any] | None,
                changes: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """`run` once the config is checked and the run dir locked."""
    resume = plain["resume"]
    args = SlimeArgs.from_config(plain)
    allowed = allowed_targets(plain)
    closers: list[Any] = []
    sinks: list[Any] = []
    exit_code = 1  # until the rollouts finish
    try:
        parts, eval_fn, schedule = _build(plain, args, allowed, run_dir, closers)
        name = (record or {}).get("name") or run_identity(plain)[0]
        store_record(run_dir, plain, name, record, changes, schedule.start_rollout_id)
        metrics_file = MetricsJsonl(os.path.join(run_dir, "metrics.jsonl"))
        metrics_file.truncate_from(schedule.start_rollout_id)
        group = run_identity(plain)[1]
        sink = build(plain["logger"], allowed=allowed, where="logger")
        if sink is not None:
            sinks.append(sink)  # finished (and torn down) even when start fails half-way
            sink.start(run_dir=run_dir, name=name, group=group, config=plain, resume=bool(resume))
            if changes and callable(getattr(sink, "record_config_changes", None)):
                sink.record_config_changes(plain, read_changes(run_dir))
        progress = RunProgress(schedule.num_rollout, run_dir)
        pipeline = Pipeline(parts=parts, schedule=schedule, metrics_file=metrics_file, eval_fn=eval_fn, sinks=sinks,
                            progress=progress)
        if schedule.start_rollout_id >= schedule.num_rollout:
            logger.warning("nothing to run: rollouts start at %d but num_rollout=%d; to continue a finished run, "
                           "pass a larger num_rollout (e.g. num_rollout=%d)", schedule.start_rollout_id,
                           schedule.num_rollout, schedule.start_rollout_id + schedule.num_rollout)
        else:
            progress_logger.info("run dir %s: rollouts %d..%d", run_dir, schedule.start_rollout_id,
                                 schedule.num_rollout - 1)
        result = pipeline.run()
        if progress.rows:
            progress_logger.info("%s", progress.summary())
        exit_code = 0
        return result
    except KeyboardInterrupt:
        exit_code = 130
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the clean-up short
        raise
    finally:
        for sink in sinks:
            sink.finish(exit_code=exit_code)
        for obj in closers:
            close = getattr(obj, "close", None)
            if callable(close):
                close()


def _naming_errors(fn: Any, node: dict[str, Any] | None, where: str) -> Any:
    """`fn` whose exceptions carry a note naming its path, when `node` names a function plugin
    (`path: pkg.mod.fn`); built objects (`_target_`) are returned as they are."""
    if fn is None or not isinstance(node, dict) or "_target_" in node or not node.get("path"):
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


def _load_tokenizer(plain: dict[str, Any]) -> Any:
    """The tokenizer of `hf_checkpoint` (for engines that load theirs lazily)."""
    from pipeline.engines.assets import load_tokenizer, resolve_checkpoint

    return load_tokenizer(resolve_checkpoint(plain["hf_checkpoint"], plain["paths"]["cache_dir"]))


def _build(plain: dict[str, Any], args: SlimeArgs, allowed: tuple[str, ...], run_dir: str,
           closers: list[Any]) -> tuple[StageParts, Any, Schedule]:
    """Build engine, tokenizer, data source, reward, filters, rollout/eval functions, hooks."""
    rollout_cls, eval_cls = _target_of(plain["rollout"], allowed, "rollout"), _target_of(plain["eval"], allowed, "eval")
    consumers = (rollout_cls, eval_cls)
    ds_node = dict(plain["data_source"])
    if ds_node.get("save_dir") is None:
        ds_node["save_dir"] = os.path.join(run_dir, "checkpoints")
    # engines load their tokenizer lazily (the hf one converts the model on first access), so it
    # is fetched only for parts that need it at build time; engine rollouts take engine.tokenizer
    # (a data_source_path class loads its own, from args.hf_checkpoint, as in slime)
    ds_tokenizer = not plain["data_source_path"] and (
        bool(ds_node.get("apply_chat_template")) or ds_node.get("max_prompt_len") is not None)
    needs_tokenizer = ds_tokenizer or any(_accepts(c, "tokenizer") and not _accepts(c, "engine") for c in consumers)
    engine = None
    if needs_tokenizer or any(_accepts(c, "engine") for c in consumers):
        engine = build(plain["engine"], allowed=allowed, where="engine")
        closers.append(engine)
    tokenizer = None
    if needs_tokenizer:
        tokenizer = getattr(engine, "tokenizer", None)
        if tokenizer is None:
            tokenizer = _load_tokenizer(plain)
    if plain["data_source_path"]:  # slime's --data-source-path: the class, built as slime builds it
        # with slime's --save / --load: the run dir (state under <run>/rollout/, slime's layout)
        ds_args = args if "save" in args else args.replace(save=run_dir, load=run_dir if plain["resume"] else None)
        data_source = build({"path": plain["data_source_path"]}, allowed=allowed, where="data_source_path")(ds_args)
    else:
        buffer_filter = build(plain["filter"], allowed=allowed, where="filter")
        data_source = build(ds_node, allowed=allowed, where="data_source", args=args, tokenizer=tokenizer,
                            buffer_filter=buffer_filter)
    start = plain["start_rollout_id"]
    if plain["resume"]:
        last = data_source.load()
        if last is None:
            save_dir = ds_node["save_dir"]
            found = sorted(os.listdir(save_dir)) if os.path.isdir(save_dir) else []
            raise FileNotFoundError(
                f"resume: no valid checkpoint in {save_dir}; expected checkpoints/rollout_<id>.json"
                + (f" (found {found}, none loadable; the warnings above say why)" if found else ""))
        start = last + 1
        logger.info("resume: %s from checkpoint %d, next rollout %d", run_dir, last, start)
    needs_reward = any(_accepts(c, "reward") for c in consumers)
    reward = build(plain["reward"], allowed=allowed, where="reward") if needs_reward else None
    filter_node = plain["dynamic_filter"]
    dynamic_filter = _naming_errors(build(filter_node, allowed=allowed, where="dynamic_filter"),
                                    filter_node, "dynamic_filter")
    sample_hooks = SampleHooks([(path, build({"path": path}, allowed=allowed, where="rollout_sample_hook_path"))
                                for path in plain["rollout_sample_hook_path"]])
    runtime = dict(engine=engine, reward=reward, dynamic_filter=dynamic_filter, tokenizer=tokenizer,
                   args=args, run_dir=run_dir, sample_hooks=sample_hooks)
    rollout_fn = _naming_errors(build(plain["rollout"], allowed=allowed, where="rollout", **runtime),
                                plain["rollout"], "rollout")
    eval_fn = _naming_errors(build(plain["eval"], allowed=allowed, where="eval", **runtime), plain["eval"], "eval")
    closers.extend(x for x in (rollout_fn, eval_fn, data_source) if x is not None)
    hooks = {field: build({"path": plain[key]}, allowed=allowed, where=key) for key, field in _HOOKS.items()}
    parts = StageParts(args=args, data_source=data_source, rollout_fn=rollout_fn, run_dir=run_dir, **hooks)
    schedule = Schedule(start_rollout_id=start, num_rollout=plain["num_rollout"],
                        save_interval=plain["save_interval"], eval_interval=plain["eval_interval"],
                        eval_before_train=plain["eval_before_train"] and not plain["resume"])
    return parts, eval_fn, schedule
