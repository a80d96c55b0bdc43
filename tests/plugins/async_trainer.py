"""A trainer and a stage for the train_async tests: they record when and where things ran."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from pipeline.train.function import FunctionTrainer

# ("train" | "generate", rollout_id, start, end, detail) in the order the calls ended
EVENTS: list[tuple[str, int, float, float, Any]] = []
# seconds each train call sleeps (the tests set it)
TRAIN_SECONDS = [0.0]


class VersionedTrainer(FunctionTrainer):
    """trainer=function whose versions reach the engine: an empty state dict, so the scripted
    engine records each version (as the policy-gradient trainer's full state dict would)."""

    def weights_for_engine(self) -> dict[str, Any]:
        return {}


def record_train(args: Any, rollout_id: int, train_data: dict[str, Any]) -> dict[str, float]:
    """A user train function: sleeps TRAIN_SECONDS[0]; fails at rollout $ASYNC_TEST_FAIL_AT."""
    start = time.perf_counter()
    if os.environ.get("ASYNC_TEST_FAIL_AT") == str(rollout_id):
        raise RuntimeError(f"training failed at rollout {rollout_id}")
    time.sleep(TRAIN_SECONDS[0])
    EVENTS.append(("train", rollout_id, start, time.perf_counter(),
                   (threading.current_thread().name, list(train_data["sample_indices"]))))
    return {"samples": float(len(train_data["tokens"]))}


def note_generated(ctx: Any, parts: Any) -> None:
    """An extra stage after generate: the rollout's generate interval and the engine's version."""
    end = time.perf_counter()
    EVENTS.append(("generate", ctx.rollout_id, end - ctx.rollout_time, end, parts.plugin("engine").weight_version))
