"""Errors of the data layer; every message names the file, the line (or row) and the key."""

from __future__ import annotations

__all__ = ["DataError", "CheckpointError", "DataFingerprintMismatch"]


class DataError(ValueError):
    """A prompt dataset, a slice, a key or a data-source argument is wrong."""


class CheckpointError(ValueError):
    """A data-source checkpoint is missing, truncated, corrupt or of an unknown format."""


class DataFingerprintMismatch(CheckpointError):
    """A checkpoint was written for different data than the data source now reads."""
