"""The wandb sink: offline unless the user asks for online; resumable; always finished."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from pipeline.sinks.redact import redact, redact_text

__all__ = ["WandbSink", "RUN_ID_FILE"]

logger = logging.getLogger(__name__)

# file in the run dir holding the wandb run id, so `resume=<run dir>` continues the same run
RUN_ID_FILE = "wandb_run_id.txt"


class WandbSink:
    """Logs each step's metrics to one wandb run stored under `<run>/wandb/`."""

    def __init__(self, project: str, mode: str = "offline", entity: str | None = None,
                 tags: list[str] | None = None, notes: str | None = None) -> None:
        if mode not in ("offline", "online", "disabled"):
            raise ValueError(f"logger.mode: expected offline, online or disabled, got {mode!r}")
        self.project, self.mode, self.entity = project, mode, entity
        self.tags, self.notes = list(tags or []), notes
        self.run: Any = None

    def start(self, *, run_dir: str, name: str, group: str | None, config: dict[str, Any],
              resume: bool = False) -> None:
        """wandb.init into `<run_dir>/wandb`; with `resume` the run id stored in run_dir is reused."""
        import wandb

        # an explicit WANDB_MODE in the environment wins over the config
        mode = os.environ.get("WANDB_MODE") or self.mode
        id_file = Path(run_dir) / RUN_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.exists() else None
        if resume and run_id is None:
            logger.warning("resume: %s has no %s; starting a new wandb run", run_dir, RUN_ID_FILE)
        # api keys, tokens, passwords, auth headers never reach wandb (pipeline.sinks.redact): the
        # config is redacted, so is the run name (made of the command-line overrides) and sys.argv,
        # which wandb records in the run metadata
        argv, sys.argv = sys.argv, [redact_text(a) for a in sys.argv]
        try:
            self.run = wandb.init(
                project=self.project, entity=self.entity, name=redact_text(name), group=group, tags=self.tags,
                notes=self.notes, config=redact(config), dir=run_dir, mode=mode, id=run_id,
                resume="allow" if run_id else None, reinit="finish_previous",
                # no wandb banners / run summaries on the console (the run's summary table says
                # where the offline run is); WANDB_SILENT=false brings them back
                settings=wandb.Settings(silent=os.environ.get("WANDB_SILENT", "true").lower() != "false"),
            )
        finally:
            sys.argv = argv
        id_file.write_text(self.run.id)

    def record_config_changes(self, config: dict[str, Any], changes: list[dict[str, Any]]) -> None:
        """A resume changed the config: update the run's config to `config` and store every change so
        far (`<run>/config_changes.jsonl` lines, with the rollout id each took effect at) under
        `config_changes`."""
        self.run.config.update({**redact(config), "config_changes": changes}, allow_val_change=True)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """One wandb history row at `step`."""
        self.run.log(dict(metrics), step=int(step))

    def finish(self, exit_code: int = 0) -> None:
        """finish() the run (marked failed when exit_code != 0), then tear the wandb service down."""
        import wandb

        try:
            if self.run is not None:
                self.run.finish(exit_code=exit_code)
        finally:
            self.run = None
            wandb.teardown()
