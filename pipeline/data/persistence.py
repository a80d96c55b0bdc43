"""Checkpointing of data sources (docs/contracts.md §5): state_dict, save/load, slime state files."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pipeline.data import checkpoint as ckpt
from pipeline.data.errors import CheckpointError, DataFingerprintMismatch
from pipeline.data.sample_codec import gc_paused, json_default

__all__ = ["CheckpointMixin", "STATE_FORMAT"]

logger = logging.getLogger(__name__)

STATE_FORMAT = "rollout-pipeline/data-source"


class CheckpointMixin:
    """state_dict / load_state_dict / save / load for `PlainDataSource` (and subclasses)."""

    dataset: Any
    n_samples_per_prompt: int
    seed: int
    shuffle: bool
    save_dir: Any
    load_dir: Any
    keep_checkpoints: int
    allow_data_change: bool
    epoch_id: int
    sample_offset: int
    sample_group_index: int
    sample_index: int
    current_rollout_id: int | None
    metadata: dict[str, Any]

    def fingerprint(self) -> dict[str, Any]:
        """Data fingerprint plus the settings that decide the order and group shape."""
        data = self.dataset.fingerprint() if self.dataset is not None else {"prompt_data": None}
        return {**data, "n_samples_per_prompt": self.n_samples_per_prompt,
                "seed": self.seed, "shuffle": self.shuffle}

    def state_dict(self) -> dict[str, Any]:
        """The whole state as JSON-able data."""
        return {
            "format": STATE_FORMAT, "class": type(self).__name__, "fingerprint": self.fingerprint(),
            "epoch_id": self.epoch_id, "sample_offset": self.sample_offset,
            "sample_group_index": self.sample_group_index, "sample_index": self.sample_index,
            "current_rollout_id": self.current_rollout_id, "metadata": self.metadata,
        }

    def load_state_dict(self, state: dict[str, Any], *, source: str = "state", copy_state: bool = True) -> None:
        """Restore `state_dict()`; refuses a fingerprint mismatch unless allow_data_change.

        The state is copied first (a JSON round trip) so the restored source shares no
        mutable object with the caller's dict; `load()` skips that for freshly read files.
        """
        if copy_state:
            state = json.loads(json.dumps(state, default=json_default))
        if state.get("format") != STATE_FORMAT:
            raise CheckpointError(f"{source}: not a data-source state (format {state.get('format')!r})")
        diffs = ckpt.diff_fingerprints(state["fingerprint"], self.fingerprint())
        if diffs:
            msg = f"{source} was written for different data: " + "; ".join(diffs)
            if not self.allow_data_change:
                raise DataFingerprintMismatch(msg + ". Pass data_source.allow_data_change=true to load it anyway.")
            logger.warning("%s (allow_data_change is set; loading anyway)", msg)
        self.epoch_id = int(state["epoch_id"])
        self.sample_offset = min(int(state["sample_offset"]), len(self))
        self.sample_group_index = int(state["sample_group_index"])
        self.sample_index = int(state["sample_index"])
        self.current_rollout_id = state.get("current_rollout_id")
        self.metadata = dict(state.get("metadata") or {})

    def _checkpoint_state(self) -> dict[str, Any]:
        """What `save` writes: `state_dict()`, where subclasses may put numpy arrays."""
        return self.state_dict()

    def save(self, rollout_id: int) -> Path:
        """Write `<save_dir>/rollout_<id>.json` atomically and keep the newest `keep_checkpoints`."""
        if self.save_dir is None:
            raise CheckpointError("save: no save_dir configured for the data source")
        path = ckpt.checkpoint_path(self.save_dir, rollout_id)
        with gc_paused():
            ckpt.write_checkpoint(path, {**self._checkpoint_state(), "rollout_id": int(rollout_id)})
        ckpt.prune_checkpoints(self.save_dir, self.keep_checkpoints)
        logger.info("saved data-source state to %s", path)
        return path

    def load(self, rollout_id: int | None = None) -> int | None:
        """Load checkpoint `rollout_id`, or the newest valid one when None; returns its id.

        Returns None when there is nothing to load. A truncated or corrupt file is skipped with
        a warning when searching for the newest; an explicitly requested one raises.
        A slime `global_dataset_state_dict_<id>.pt` in the same folder is read as well.
        """
        directory = self.load_dir or self.save_dir
        if directory is None:
            return None
        with gc_paused(promote=True):  # parse + decode build many long-lived objects
            return self._load_from(Path(directory), rollout_id)

    def _load_from(self, directory: Path, rollout_id: int | None) -> int | None:
        if rollout_id is not None:
            path = ckpt.checkpoint_path(directory, rollout_id)
            if path.is_file():
                self.load_state_dict(ckpt.read_checkpoint(path), source=str(path), copy_state=False)
                return int(rollout_id)
            slime = directory / f"global_dataset_state_dict_{int(rollout_id)}.pt"
            if slime.is_file():
                self._load_slime(slime)
                return int(rollout_id)
            logger.info("no data-source checkpoint %s; starting fresh", path)
            return None
        for rid, path in reversed(ckpt.list_checkpoints(directory)):
            try:
                state = ckpt.read_checkpoint(path)
            except CheckpointError as exc:
                logger.warning("skipping invalid checkpoint: %s", exc)
                continue
            self.load_state_dict(state, source=str(path), copy_state=False)
            return rid
        return None

    def _load_slime(self, path: Path) -> None:
        state = ckpt.read_slime_state(path)
        self.epoch_id = int(state["epoch_id"])
        self.sample_offset = min(int(state["sample_offset"]), len(self))
        self.sample_group_index = int(state["sample_group_index"])
        self.sample_index = int(state["sample_index"])
        self.metadata = dict(state.get("metadata") or {})
        logger.info("loaded slime data-source state %s (slime saves no buffer)", path)
