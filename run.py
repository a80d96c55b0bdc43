"""Command line: `python run.py [group=option ...] [key=value ...]` (Hydra).

`python run.py --help` lists the config groups and options; `--cfg job` prints the config;
`-m` runs a sweep (one job per combination, a summary table in the sweep dir at the end).
"""

from __future__ import annotations

import gc
import signal
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from pipeline.config.args import ConfigError
from pipeline.process.stop_signals import ignore_further_stops
from pipeline.run.run_lock import RunDirLocked
from pipeline.run.session import prepare_argv


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Run the pipeline for one composed config (one job of a sweep).

    A single run refused at pre-flight (a `ConfigError`: the message lists each key and what was
    expected) ends with that message and exit code 1, not a traceback; in a sweep the error is
    Hydra's to report per job, so the other jobs still run. A run dir that a live run holds ends
    the command with its message (in a sweep too: it is a job another command is running).
    """
    # imported here, not at the top: `--help` and `--cfg job` end inside Hydra before this runs, so
    # they do not pay for importing torch (about 3 s)
    from pipeline.run.app import run

    try:
        run(cfg)
    except RunDirLocked as exc:  # a live run writes there (a sweep's job, or a dir the checks before Hydra missed)
        sys.exit(f"Error: {exc}")
    except ConfigError as exc:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise
        sys.exit(f"Error: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    # resume=<run dir>: restore its overrides, write into it, lock it (before Hydra writes anything)
    try:
        sys.argv = prepare_argv(sys.argv)
    except (ConfigError, RunDirLocked) as exc:
        sys.exit(f"Error: {exc}")
    try:
        main()
    except KeyboardInterrupt:  # outside a run's rollouts (a run handles its own: exit 130 and its resume command)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.stderr.write("interrupted (Ctrl-C) while Hydra was setting up a run or between sweep jobs; finished "
                         "runs are complete; a sweep continues with python run.py resume=<sweep dir>\n")
        sys.exit(130)
    except SystemExit as exc:
        if exc.code in (130, 143):  # stopped (Ctrl-C, SIGTERM): a second one does not turn the exit into a traceback
            ignore_further_stops()
        raise
    finally:
        # Every object left is exempted from the cyclic collector: the interpreter's shutdown
        # otherwise runs it again and again over the millions of objects torch, transformers and
        # sympy leave behind, 1.5-2 s after the run has finished (one collection here instead
        # costs 0.8 s). Nothing of ours waits on it: files are closed and renamed in place, sinks
        # finished; atexit handlers (logging, Ray, wandb) still run as usual.
        gc.freeze()
