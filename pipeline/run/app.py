"""The testable entry point: validate the config, build the parts, run the pipeline.

`run(cfg)` is what `run.py` calls under `@hydra.main`; tests call it with a composed config.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from omegaconf import DictConfig

from pipeline.run import run_lock
from pipeline.cluster.devices import process_cpu_idle, visible_gpus
from pipeline.config.args import SlimeArgs, to_plain, validate
from pipeline.process.logging_setup import RunProgress, configure_console, progress_logger
from pipeline.process.malloc import keep_freed_memory
from pipeline.process.openmp import configure_openmp_wait
from pipeline.process.stop_signals import exit_code, ignore_further_stops, sigterm_as_interrupt, stop_name
from pipeline.config.plugins import SLOTS_BY_NAME, ConfigError, allowed_targets
from pipeline.run.run_record import check_resume_config, project_upgrades, read_changes, read_record
from pipeline.run.fresh_run import existing_run_problem, has_checkpoint
from pipeline.run.session import (discard_session_files, hydra_config, interrupt_hint, session_overrides,
                                  store_record)
from pipeline.sinks.jsonl import MetricsJsonl

__all__ = ["run", "run_identity"]

logger = logging.getLogger(__name__)


def _multirun(hc: Any) -> bool:
    from hydra.types import RunMode

    return hc is not None and hc.mode == RunMode.MULTIRUN


def run_identity(plain: dict[str, Any]) -> tuple[str, str | None]:
    """(run name, wandb group): a single run is named after its run dir plus the command-line
    overrides; a sweep job after its overrides, grouped by the sweep folder name."""
    run_dir_name = os.path.basename(os.path.normpath(plain["paths"]["output_dir"]))
    hc = hydra_config()
    if hc is None:
        return run_dir_name, None
    if _multirun(hc):
        return hc.job.override_dirname or hc.job.name, os.path.basename(os.path.normpath(hc.sweep.dir))
    return " ".join(filter(None, (run_dir_name, hc.job.override_dirname))), None


def _sweep_dir() -> str | None:
    """The sweep dir of this job when it is one job of a sweep (`-m`); else None."""
    hc = hydra_config()
    return os.path.abspath(hc.sweep.dir) if _multirun(hc) else None


def run(cfg: DictConfig) -> dict[str, Any]:
    """Validate `cfg`, build every part, run the rollouts; returns the last step's metrics.

    A resume is checked against the run's stored config first (`pipeline.run.run_record`); the run
    dir is locked while the run writes into it (`pipeline.run.run_lock`). A pre-flight error leaves
    nothing behind; Ctrl-C ends with exit code 130 and the command that resumes the run, SIGTERM
    likewise with 143.
    """
    configure_console()
    # whether anything in this process computes on the CPU, decided without torch (the process-level
    # CPU tunings switch off when nothing does)
    cpu_idle = _cpu_idle(cfg)
    # before pre-flight imports the plugins (and with them torch): libgomp reads its settings once;
    # logged once pre-flight has passed (a refused resume adds nothing to the run's log)
    openmp_wait = configure_openmp_wait(cfg.get("omp_spin_count"), cpu_idle)
    try:
        validate(cfg)
        plain = to_plain(cfg)
        plain.pop("hydra", None)
        resume = plain["resume"]
        run_dir = os.path.abspath(resume or plain["paths"]["output_dir"])
        if plain["continue_sweep"] and not resume and has_checkpoint(run_dir):  # a job of a continued sweep
            resume = plain["resume"] = run_dir
        record = read_record(run_dir) if resume else None
        taken = None if resume else existing_run_problem(run_dir, "paths.output_dir")
        if taken:
            raise ConfigError(taken)
        overrides = session_overrides(record) if resume else None
        changes = check_resume_config((record or {}).get("config"), plain, run_dir, overrides) if resume else {}
        upgrades = project_upgrades(changes, overrides)
    except ConfigError:
        discard_session_files(resumed=bool(cfg.get("resume")) or bool(cfg.get("continue_sweep")))
        raise
    logger.info("%s", openmp_wait)
    os.makedirs(run_dir, exist_ok=True)
    run_lock.acquire(run_dir)
    # both stop signals' handlers come back only after the lock is released: a second Ctrl-C or
    # SIGTERM (ignored from the first on) does not cut the hint or the release short
    with sigterm_as_interrupt():
        try:
            with keep_freed_memory(plain["keep_freed_memory"], cpu_idle) as freed_memory:
                logger.info("%s", freed_memory)
                return _run_locked(plain, run_dir, record, changes, upgrades)
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (pipeline.process.stop_signals)
            logger.warning("%s", interrupt_hint(run_dir, plain["save_interval"], _sweep_dir(), stop_name(stop)))
            raise SystemExit(exit_code(stop)) from None
        finally:
            run_lock.release(run_dir)


def _cpu_idle(cfg: DictConfig) -> str | None:
    """`devices.process_cpu_idle` for the run's engine and trainer nodes, with the GPUs counted
    without torch; None (the CPU tunings stay on) when the nodes do not resolve: pre-flight then
    says why."""
    try:
        return process_cpu_idle(cfg.get("engine"), cfg.get("trainer"), visible_gpus())
    except Exception:  # noqa: BLE001 - an interpolation that fails here fails pre-flight too
        return None


def _run_locked(plain: dict[str, Any], run_dir: str, record: dict[str, Any] | None,
                changes: dict[str, tuple[Any, Any]], upgrades: set[str]) -> dict[str, Any]:
    """`run` once the config is checked and the run dir locked."""
    # imported once the config has passed pre-flight: a refused command ends without importing
    # torch (about 3 s)
    from pipeline.loop.parts import build_parts, build_slot, build_stages
    from pipeline.loop.runner import Pipeline

    resume = plain["resume"]
    args = SlimeArgs.from_config(plain)
    allowed = allowed_targets(plain)
    closers: list[Any] = []
    sinks: list[Any] = []
    code = 1  # until the rollouts finish
    try:
        stages = build_stages(plain, allowed)
        parts, eval_fn, schedule = build_parts(plain, args, allowed, run_dir, closers)
        name = (record or {}).get("name") or run_identity(plain)[0]
        store_record(run_dir, plain, name, record, changes, schedule.start_rollout_id, upgrades)
        metrics_file = MetricsJsonl(os.path.join(run_dir, "metrics.jsonl"))
        metrics_file.truncate_from(schedule.start_rollout_id)
        group = run_identity(plain)[1]
        sink = build_slot(SLOTS_BY_NAME["logger"], plain["logger"], allowed)
        if sink is not None:
            sinks.append(sink)  # finished (and torn down) even when start fails half-way
            sink.start(run_dir=run_dir, name=name, group=group, config=plain, resume=bool(resume))
            if changes and callable(getattr(sink, "record_config_changes", None)):
                sink.record_config_changes(plain, read_changes(run_dir))
        progress = RunProgress(schedule.num_rollout, run_dir)
        pipeline = Pipeline(parts=parts, schedule=schedule, metrics_file=metrics_file, eval_fn=eval_fn, sinks=sinks,
                            progress=progress, stages=stages)
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
        code = 0
        return result
    except KeyboardInterrupt as stop:
        code = exit_code(stop)
        ignore_further_stops()  # a second Ctrl-C or SIGTERM does not cut the clean-up short
        raise
    finally:
        for sink in sinks:
            sink.finish(exit_code=code)
        for obj in closers:
            close = getattr(obj, "close", None)
            if callable(close):
                close()
