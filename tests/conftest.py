"""Shared test set-up: offline wandb, Ray without auth, no hub downloads."""

import os

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
