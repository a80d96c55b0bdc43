"""The command line before Hydra sees it: `resume=<run dir>` continues that run's experiment.

`prepare_argv(argv)` (called by `run.py`) turns `python run.py resume=X [overrides]` into the
stored overrides of X (`pipeline.run.run_record`) followed by the new ones, writing into X itself
(`hydra.run.dir=X`) with this session's Hydra files in `X/.hydra/resume-<time>/` (the original
run's `.hydra/*.yaml` stay as they were); a fresh run's `paths.output_dir=X` becomes
`hydra.run.dir=X`, so Hydra's files lie beside the run's; a sweep dir X continues the whole sweep
(`pipeline.run.sweep_resume`). Before Hydra writes anything it checks that X is a run dir, that X
is writable, and locks X (`pipeline.run.run_lock`), so a resume of a live run fails at once. A
fresh run's explicit dir is checked by `pipeline.run.fresh_run`.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.config.plugins import ConfigError
from pipeline.run.fresh_run import (MULTIRUN_FLAGS, checkpoint_ids, fresh_target_problem, is_override,
                                    output_dir_as_run_dir, override_values)
from pipeline.run.overrides import command_arg, hydra_quoted
from pipeline.run.run_lock import acquire
from pipeline.run.run_record import (OPT_IN, RECORD_FILE, SessionOverrides, merge_overrides, override_key, read_record,
                                 record_changes, upgrade_overrides, write_record)
from pipeline.run.sweep_resume import is_sweep_dir, job_dirs, sweep_resume_argv

__all__ = ["SESSION_PREFIX", "discard_session_files", "hydra_config", "interrupt_hint", "prepare_argv",
           "resume_target_problem", "session_subdir", "store_record"]

logger = logging.getLogger(__name__)

# this session's Hydra files in a resumed run dir: .hydra/resume-<time>/
SESSION_PREFIX = "resume-"
# flags after which Hydra does not run the job (nothing to lock, nothing written)
_NO_RUN_FLAGS = ("--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--resolve", "--shell-completion", "-sc")


def resume_target_problem(resume: str) -> str | None:
    """Why `resume=<resume>` cannot be continued (not a dir, a sweep dir, no run in it, not writable);
    None when it can."""
    path = Path(resume)
    if not path.is_dir():
        return f"resume: {resume!r} is not a directory; expected a previous run dir (outputs/runs/...)"
    is_run = (path / RECORD_FILE).is_file() or (path / ".hydra").is_dir() or (path / "checkpoints").is_dir()
    jobs = [] if is_run else job_dirs(path)
    if jobs:
        listed = "\n  ".join(f"{command_arg('resume', str(j))}  ({_job_label(j)})" for j in jobs)
        return (f"resume: {resume!r} is a sweep dir; a resume continues one job, pick its dir (through the "
                f"command line, python run.py {command_arg('resume', resume)} continues every job):\n  {listed}")
    if not is_run:
        return (f"resume: {resume!r} is not a run dir (it has no {RECORD_FILE}, .hydra/ or checkpoints/); "
                f"expected a previous run dir (outputs/runs/...)")
    try:
        with tempfile.TemporaryFile(dir=path, prefix=".write-probe."):
            pass
    except OSError as exc:
        return (f"resume: the run dir {resume!r} is not writable ({exc.strerror or exc}); a resume writes its "
                f"checkpoints, metrics and logs there: make it writable (chmod -R u+w {resume}) or resume a "
                f"copy (cp -r {resume} <new dir>, then resume=<new dir>)")
    return None


def _job_label(job: Path) -> str:
    try:
        record = read_record(job)
    except ConfigError:
        record = None
    overrides = [o for o in (record or {}).get("overrides", []) if override_key(o) != "resume"]
    return " ".join(overrides) or "no overrides"


def session_subdir(run_dir: Path) -> str:
    """`.hydra/resume-<time>` for this session (a suffix when that second is taken)."""
    base = f".hydra/{SESSION_PREFIX}{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    name, i = base, 1
    while (run_dir / name).exists():
        i += 1
        name = f"{base}_{i}"
    return name


def prepare_argv(argv: list[str]) -> list[str]:
    """`argv` with a resume's stored overrides restored and its Hydra output set to the run dir;
    the run dir locked when the job will run. Raises ConfigError / RunDirLocked (nothing written)."""
    argv = [argv[0], *upgrade_overrides(argv[1:])]
    args = argv[1:]
    runs = not any(a.split("=", 1)[0] in _NO_RUN_FLAGS for a in args)
    resume = next(iter(override_values(args, "resume")), None)
    run_dirs = override_values(args, "hydra.run.dir")
    if resume in (None, "", "null"):
        argv, key = output_dir_as_run_dir(argv)
        problem = fresh_target_problem(argv[1:], key) if runs else None
        if problem:
            raise ConfigError(problem)
        return argv
    overrides = [a for a in args if is_override(a) and override_key(a) != "resume"]
    flags = [a for a in args if not is_override(a)]
    if is_sweep_dir(Path(resume)):
        sweep = Path(resume).resolve()
        return sweep_resume_argv(argv[0], sweep, overrides, [f for f in flags if f not in MULTIRUN_FLAGS],
                                 session_subdir(sweep), runs)
    if any(a in MULTIRUN_FLAGS for a in args):
        raise ConfigError("resume: a resume continues one run; drop -m (sweep over fresh runs instead)")
    problem = resume_target_problem(resume)
    if problem:
        raise ConfigError(problem)
    run_dir = Path(resume).resolve()
    if run_dirs:
        logger.warning("resume: ignoring hydra.run.dir=%s; a resume writes into its run dir %s", run_dirs[-1], run_dir)
    record = read_record(run_dir)
    task = [a for a in overrides if not override_key(a).startswith(("hydra.", "hydra/"))]
    hydra = [a for a in overrides if override_key(a).startswith(("hydra.", "hydra/"))
             and override_key(a) not in ("hydra.run.dir", "hydra.output_subdir")]
    restored = merge_overrides(upgrade_overrides(list((record or {}).get("overrides", []))), task)
    restored.append(f"resume={hydra_quoted(str(run_dir))}")
    if runs:
        acquire(run_dir, defer_log=True)
    hydra += [f"hydra.run.dir={hydra_quoted(str(run_dir))}", f"hydra.output_subdir={session_subdir(run_dir)}"]
    return [argv[0], *flags, *restored, *hydra]


def hydra_config() -> Any:
    """Hydra's config of the running job; None outside a Hydra run (a test composing a config)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get()
    except (ImportError, ValueError):
        return None


def session_overrides(record: dict[str, Any] | None) -> SessionOverrides | None:
    """The stored overrides of a resumed run and this command's, as Hydra composed them (None
    outside a Hydra run: every change then counts as the user's)."""
    hc = hydra_config()
    if hc is None:
        return None
    return SessionOverrides(stored=[str(o) for o in (record or {}).get("overrides", [])],
                            command=[str(o) for o in hc.overrides.task],
                            groups=frozenset(str(k) for k in hc.runtime.choices))


def discard_session_files(resumed: bool) -> None:
    """Remove what Hydra wrote for a command refused at pre-flight: a fresh run's (or sweep job's)
    dir when it holds nothing else, or a resume's `.hydra/resume-<time>/`. Outside a Hydra run
    there is nothing to remove."""
    hc = hydra_config()
    if hc is None:
        return
    out = Path(hc.runtime.output_dir)
    if resumed:
        subdir = hc.output_subdir
        if subdir and Path(subdir).name.startswith(SESSION_PREFIX):
            shutil.rmtree(out / subdir, ignore_errors=True)
        return
    if out.is_dir() and {p.name for p in out.iterdir()} <= {".hydra", "run.log"}:
        shutil.rmtree(out, ignore_errors=True)
        _remove_empty_parents(out)


def _remove_empty_parents(folder: Path) -> None:
    """Remove the folders above `folder` that are left empty, up to (not including) the working
    directory: Hydra made `outputs/runs/` for a run that never started. Folders outside the
    working directory are left alone."""
    cwd = Path.cwd().resolve()
    parent = folder.resolve().parent
    while parent != cwd and cwd in parent.parents:
        try:
            parent.rmdir()  # only when empty
        except OSError:
            return
        parent = parent.parent


def _listed(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items())


def store_record(run_dir: str, plain: dict[str, Any], name: str, record: dict[str, Any] | None,
                 changes: dict[str, tuple[Any, Any]], start_rollout_id: int, upgrades: set[str] | None = None) -> None:
    """Write the run record (this session's overrides and config) and log and record `changes`
    (a resume's config changes, taking effect at `start_rollout_id`): `upgrades` (keys the
    project added or whose default it changed) and resume-safe changes at INFO, changes accepted
    by the opt-in as a WARNING; one config_changes.jsonl line per kind."""
    hc = hydra_config()
    overrides = list(hc.overrides.task) if hc is not None else list((record or {}).get("overrides", []))
    upgraded = {k: v for k, v in changes.items() if k in (upgrades or set())}
    asked = {k: v for k, v in changes.items() if k not in upgraded}
    if upgraded:
        logger.info("resume: upgraded to this version's config from rollout %d on (keys the project added or "
                    "whose default it changed; not an override of yours): %s", start_rollout_id, _listed(upgraded))
        record_changes(run_dir, start_rollout_id, upgraded, opted_in=False, accepted_by="upgrade")
    if asked:
        opted_in = plain[OPT_IN] is True
        log = logger.warning if opted_in else logger.info
        log("resume: config changes from rollout %d on: %s", start_rollout_id, _listed(asked))
        record_changes(run_dir, start_rollout_id, asked, opted_in=opted_in)
    write_record(run_dir, name=name, overrides=overrides, config=plain)


def _nth(n: int) -> str:
    """'' for 1, '2nd ', '3rd ', '10th ' ..."""
    if n == 1:
        return ""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix} "


def interrupt_hint(run_dir: str, save_interval: int | None, sweep_dir: str | None = None,
                   how: str = "Ctrl-C") -> str:
    """What a stop (`how`: "Ctrl-C" or "SIGTERM") kept and the command that continues the run (and,
    for a job of a sweep in `sweep_dir`, the whole sweep). Checkpoints are written every `save_interval` rollouts (and after
    the last); rollouts finished after the newest one are redone."""
    ids = checkpoint_ids(Path(run_dir))
    if not save_interval:
        every = "save_interval=null: a checkpoint after the last rollout only"
    else:
        every = f"save_interval={save_interval}: a checkpoint after every {_nth(save_interval)}rollout"
    sweep = (f"\nContinue the whole sweep (this job from its newest checkpoint, the jobs after it from the "
             f"start) with:\n  python run.py {command_arg('resume', sweep_dir)}") if sweep_dir else ""
    if not ids:
        advice = {1: "", None: ", with a save_interval to keep part of an interrupted run"}.get(
            save_interval or None, ", with a smaller save_interval to keep more of an interrupted run")
        return (f"interrupted ({how}) before the first checkpoint ({every}); nothing to resume in {run_dir}: "
                f"start the run again{advice}{sweep}")
    return (f"interrupted ({how}): the newest checkpoint is {run_dir}/checkpoints/rollout_{max(ids)}.json "
            f"({every}); rollouts after it, finished or in flight, were not recorded and are redone on "
            f"resume. Continue with:\n"
            f"  python run.py {command_arg('resume', run_dir)}{sweep}")
