"""`python run.py resume=<sweep dir>`: continue a whole sweep, as `resume=<run dir>` continues a run.

The sweep's stored overrides (`<sweep>/multirun.yaml`) run again as a sweep into the same dir, so
Hydra numbers the jobs as before, with `continue_sweep=true`: a job whose dir holds a checkpoint
continues from it (a resume of that job, checked against its stored config like any resume), a
job that never started or stopped before its first checkpoint starts fresh, and a finished job
has nothing to run. New overrides apply to every job; they may change resume-safe keys
(`num_rollout=...`) but not the sweep's shape (no `a,b` values, no new value for a swept key). Each session's Hydra files go to
`.hydra/resume-<time>/` of every job, leaving the original ones as they were.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.run.overrides import hydra_quoted, is_sweep_override
from pipeline.config.plugins import ConfigError
from pipeline.run.run_lock import LOCK_FILE, acquire, release
from pipeline.run.run_record import RECORD_FILE, merge_overrides, override_key, upgrade_overrides

__all__ = ["SWEEP_FILE", "is_sweep_dir", "job_dirs", "sweep_resume_argv"]

# Hydra's record of a sweep, in the sweep dir
SWEEP_FILE = "multirun.yaml"
# hydra overrides a continued sweep sets itself
_OWN_HYDRA_KEYS = ("hydra.sweep.dir", "hydra.run.dir", "hydra.output_subdir", "hydra.mode")


def job_dirs(path: Path) -> list[Path]:
    """The job dirs of a sweep dir (subfolders holding a run's Hydra files or record), in job order."""
    jobs = [p for p in path.iterdir() if p.is_dir() and ((p / ".hydra").is_dir() or (p / RECORD_FILE).is_file())]
    return sorted(jobs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))


def is_sweep_dir(path: Path) -> bool:
    """A dir written by `python run.py -m` (its multirun.yaml), not a run dir."""
    return (path / SWEEP_FILE).is_file() and not (path / RECORD_FILE).is_file()


def _stored_overrides(sweep: Path) -> tuple[list[str], list[str]]:
    """(task, hydra) overrides of the command that started the sweep."""
    try:
        stored = yaml.safe_load((sweep / SWEEP_FILE).read_text(encoding="utf-8"))
        overrides = stored["hydra"]["overrides"]
        return [str(o) for o in overrides.get("task") or []], [str(o) for o in overrides.get("hydra") or []]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ConfigError(f"resume: {sweep / SWEEP_FILE} cannot be read as Hydra's sweep record ({exc}); "
                          f"continue its jobs one by one with resume=<job dir>") from exc


def sweep_resume_argv(prog: str, sweep: Path, overrides: list[str], flags: list[str], subdir: str,
                      runs: bool) -> list[str]:
    """The `-m` command line that continues the sweep in `sweep` with the new `overrides` (no
    `resume`) and command-line `flags`; Hydra's files of this session under `subdir` of each job.
    A job a live run holds fails it at once (when the command `runs`)."""
    task = [o for o in overrides if not override_key(o).startswith(("hydra.", "hydra/"))]
    hydra = [o for o in overrides if override_key(o).startswith(("hydra.", "hydra/"))
             and override_key(o) not in _OWN_HYDRA_KEYS]
    reshaped = [o for o in task if is_sweep_override(o)]
    if reshaped:
        raise ConfigError(f"resume: {reshaped[0]!r} changes the sweep's jobs; a resume of a sweep continues the "
                          f"jobs it has (new values apply to each, e.g. num_rollout=20): start a new sweep for "
                          f"other combinations")
    stored_task, stored_hydra = _stored_overrides(sweep)
    swept = {override_key(o): o for o in stored_task if is_sweep_override(o)}
    narrowed = [o for o in task if override_key(o) in swept]
    if narrowed:
        raise ConfigError(f"resume: {narrowed[0]!r} sets a key this sweep sweeps "
                          f"({swept[override_key(narrowed[0])]}); a resume of a sweep continues all its jobs: "
                          f"continue one of them with resume=<job dir>")
    if runs:
        for job in job_dirs(sweep):
            if (job / LOCK_FILE).is_file():
                acquire(job, defer_log=True)  # a live run there: fail now, not in the middle of the sweep
                release(job)
    task = merge_overrides(upgrade_overrides(stored_task), task) + ["continue_sweep=true"]
    hydra = [o for o in stored_hydra if override_key(o) not in _OWN_HYDRA_KEYS] + hydra
    return [prog, "-m", *flags, *task, *hydra, f"hydra.sweep.dir={hydra_quoted(str(sweep))}",
            f"hydra.output_subdir={subdir}"]
