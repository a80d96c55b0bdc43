"""A fresh run's explicit dir, checked before Hydra writes there.

`fresh_target_problem` refuses a fresh run (no `resume=`) into a `hydra.run.dir` that holds a run
with a checkpoint, or a sweep into a `hydra.sweep.dir` whose jobs have one (a fresh run there would
truncate that run's metrics, prune its checkpoints and overwrite its record), and a dir at or under
a file; a live run's dir raises RunDirLocked. `output_dir_as_run_dir` points Hydra at a fresh single
run's `paths.output_dir`, so its run.log and .hydra/ lie beside the run's files, and refuses a
sweep whose jobs would all write into one plain `paths.output_dir`.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config.plugins import ConfigError
from pipeline.data.checkpoint import list_checkpoints
from pipeline.run.overrides import command_arg, is_sweep_override, override_value, unique_dir_arg
from pipeline.run.run_lock import LOCK_FILE, acquire
from pipeline.run.run_record import override_key
from pipeline.run.sweep_resume import job_dirs

__all__ = ["MULTIRUN_FLAGS", "checkpoint_ids", "existing_run_problem", "fresh_target_problem", "has_checkpoint",
           "is_override", "output_dir_as_run_dir", "override_values"]

# the flags that make a command a sweep
MULTIRUN_FLAGS = ("--multirun", "-m")


def is_override(arg: str) -> bool:
    """Whether the command-line argument `arg` is an override (`key=value`, `~key`), not a flag."""
    return not arg.startswith("-") and ("=" in arg or arg.startswith("~"))


def checkpoint_ids(run_dir: Path) -> list[int]:
    """The rollout ids of the complete checkpoint files in `run_dir/checkpoints` (no `.tmp`)."""
    return [rollout_id for rollout_id, _ in list_checkpoints(run_dir / "checkpoints")]


def has_checkpoint(run_dir: str) -> bool:
    """Whether `run_dir` holds a complete checkpoint file (a run a resume can continue)."""
    return bool(checkpoint_ids(Path(run_dir)))


def existing_run_problem(run_dir: str, key: str = "hydra.run.dir") -> str | None:
    """Why a fresh run (no `resume=`) must not write into `run_dir`, named by the override `key`:
    it holds a run with a checkpoint, which a fresh run would mix with its own. None when it holds
    none (a new or empty dir, one refused at pre-flight, or a run stopped before its first
    checkpoint, which the interrupt message tells to start again)."""
    ids = checkpoint_ids(Path(run_dir))
    if not ids:
        return None
    name = Path(run_dir).name
    return (f"{key}={run_dir} already holds a run (newest checkpoint: rollout {max(ids)}); a fresh run there "
            f"would truncate its metrics.jsonl, prune its checkpoints and overwrite its record. Continue that "
            f"run with\n  python run.py {command_arg('resume', run_dir)}\nor start a new one beside it with "
            f"{unique_dir_arg(key, run_dir)} (the first free {name}_2, {name}_3, ...) or "
            f"another dir, or delete {run_dir} to start over")


def _not_a_folder(key: str, path: str) -> str | None:
    """Why `path` (or a folder above it) cannot become the run's folder: it is a file."""
    for p in (Path(path), *Path(path).parents):
        if p.exists() and not p.is_dir():
            return (f"{key}={path}: {p} is a file, not a folder; the run writes its files into a folder: choose "
                    f"another path")
        if p.is_dir():
            return None
    return None


def _sweep_problem(sweep_dir: str) -> str | None:
    """Why a fresh sweep must not write into `sweep_dir`: one of its job dirs holds a run."""
    path = Path(sweep_dir)
    jobs = job_dirs(path) if path.is_dir() else []
    taken = [job for job in jobs if existing_run_problem(str(job))]
    if not taken:
        return None
    return (f"hydra.sweep.dir={sweep_dir} already holds a sweep (jobs with checkpoints: "
            f"{', '.join(j.name for j in taken)}); a new sweep there would overwrite its jobs. Continue that "
            f"sweep with\n  python run.py {command_arg('resume', sweep_dir)}\nor start a new one beside it with "
            f"{unique_dir_arg('hydra.sweep.dir', sweep_dir)} or another dir")


def override_values(args: list[str], key: str) -> list[str]:
    """The values (as Hydra reads them) of the overrides of `key` in `args`, in order (a deletion
    `~key` has none)."""
    return [override_value(a) for a in args if is_override(a) and "=" in a and override_key(a) == key]


def fresh_target_problem(args: list[str], key: str = "hydra.run.dir") -> str | None:
    """Why the explicit run dir (or sweep dir) of a fresh run cannot take it, naming the run dir
    by `key`; a live run there raises RunDirLocked before Hydra rewrites its `.hydra` files."""
    if any(a in MULTIRUN_FLAGS for a in args):
        sweep_dirs = override_values(args, "hydra.sweep.dir")
        if not sweep_dirs:
            return None
        continues = any(v.lower() == "true" for v in override_values(args, "continue_sweep"))
        return _not_a_folder("hydra.sweep.dir", sweep_dirs[-1]) or (
            None if continues else _sweep_problem(sweep_dirs[-1]))
    run_dirs = override_values(args, "hydra.run.dir")
    if not run_dirs:
        return None
    if (Path(run_dirs[-1]) / LOCK_FILE).is_file():
        acquire(run_dirs[-1], defer_log=True)
    return _not_a_folder(key, run_dirs[-1]) or existing_run_problem(run_dirs[-1], key)


def output_dir_as_run_dir(argv: list[str]) -> tuple[list[str], str]:
    """A fresh single run's `paths.output_dir=V` turned into `hydra.run.dir=V` (the run dir's
    default, `${hydra:runtime.output_dir}`, is then V), so Hydra's run.log and .hydra/ lie beside
    the run's files; with the key the user named the dir by. Raises ConfigError when both keys are
    given for different dirs, and for a sweep with one plain `paths.output_dir` (every job would
    write into that one dir); a sweep over it, or one built on interpolations, is left as it is."""
    args = argv[1:]
    outputs = [a for a in args if is_override(a) and "=" in a and override_key(a) == "paths.output_dir"]
    if not outputs:
        return argv, "hydra.run.dir"
    value, run_dirs = outputs[-1].split("=", 1)[1], override_values(args, "hydra.run.dir")
    if any(a in MULTIRUN_FLAGS for a in args):
        if "${" not in value and not is_sweep_override(outputs[-1]):
            raise ConfigError(f"paths.output_dir={value} in a sweep: every job would write into that one dir (the "
                              f"second finding the first's checkpoints); set the sweep's dir instead, "
                              f"{command_arg('hydra.sweep.dir', override_value(outputs[-1]))}, where job <n> "
                              f"writes into <dir>/<n>")
        return argv, "hydra.run.dir"
    if "runtime.output_dir" in value:  # refers to Hydra's dir itself
        return argv, "hydra.run.dir"
    if run_dirs:
        literal = "${" not in value + run_dirs[-1]
        if not literal or Path(override_value(outputs[-1])).absolute() != Path(run_dirs[-1]).absolute():
            raise ConfigError(f"paths.output_dir={value} and hydra.run.dir={run_dirs[-1]} name two dirs: the run "
                              f"writes its files into paths.output_dir and Hydra its run.log and .hydra/ into "
                              f"hydra.run.dir; give one of them (either one sets both)")
        return argv, "hydra.run.dir"
    kept = [a for a in argv if a not in outputs]
    return [*kept, f"hydra.run.dir={value}"], "paths.output_dir"
