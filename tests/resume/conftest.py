"""The rollout test helpers (tests/rollout/rollout_helpers.py) on the path for these tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
