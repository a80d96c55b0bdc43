"""`trainer=function`: your own `train(args, rollout_id, train_data) -> metrics`, by dotted path.

The function gets the run's slime-named `args`, the rollout id and the train data the pipeline
produced (slime's keys: tokens, response_lengths, loss_masks, rewards, rollout_log_probs, ...);
it returns a dict of metrics (keys without a "/" are logged as train/<key>) or None. It owns its
model: the pipeline pushes no weights to the engine for it (`weights_for_engine` is None);
`weight_version` counts its calls, and is saved and restored with the checkpoint.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from pipeline.process.atomic import atomic_write_text
from pipeline.config.plugins import allowed_targets, load_object

__all__ = ["FunctionTrainer"]


class FunctionTrainer:
    """Calls a user train function once per rollout (module docstring)."""

    def __init__(self, train_function_path: str | None = None, fn: Callable[..., Any] | None = None, args: Any = None) -> None:
        if not train_function_path and fn is None:
            raise ValueError("trainer=function needs trainer.train_function_path=<pkg.module.train> (your "
                             "train(args, rollout_id, train_data) -> metrics)")
        self.train_function_path = train_function_path
        self._fn = fn
        self._args: Any = None
        self.weight_version = 0
        if args is not None:
            self.bind_args(args)

    def bind_args(self, args: Any) -> None:
        """Load the function through the run's allowlist; it will receive `args`."""
        self._args = args
        if self._fn is None:
            self._fn = load_object(self.train_function_path, allowed_targets(args), "trainer.train_function_path")

    def train(self, rollout_id: int, train_data: dict[str, Any]) -> dict[str, float]:
        """Call the function; its metrics (train/ prefixed where they have no area) plus
        perf/train_time."""
        if self._fn is None:  # never bound to a run (so no args): the default allowlist
            self.bind_args(None)
        start = time.perf_counter()
        out = self._fn(self._args, rollout_id, train_data)
        if out is not None and not isinstance(out, dict):
            raise TypeError(f"trainer function {self.train_function_path}: returned {type(out).__name__}; expected a dict of "
                            f"metrics or None")
        self.weight_version += 1
        metrics = {k if "/" in str(k) else f"train/{k}": v for k, v in (out or {}).items()}
        metrics["perf/train_time"] = time.perf_counter() - start
        return metrics

    def weights_for_engine(self) -> None:
        """None: a user trainer syncs its own weights."""
        return None

    def save(self, directory: str) -> None:
        atomic_write_text(Path(directory) / "trainer_state.json",
                          json.dumps({"weight_version": self.weight_version, "train_function_path": self.train_function_path}))

    def load(self, directory: str) -> None:
        state = json.loads((Path(directory) / "trainer_state.json").read_text(encoding="utf-8"))
        self.weight_version = int(state["weight_version"])
