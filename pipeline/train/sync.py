"""Weight sync after a trainer update: the engine serves the trainer's weights at its version.

`push_weights(trainer, engine, run_dir)`:
- an engine with `update_weights(state, version)` (hf, ray, sglang, scripted) gets
  `trainer.weights_for_engine()` (full HF names, LoRA merged) and `trainer.weight_version`;
- else an engine with `update_lora(adapter_path, version)` (openai, vLLM runtime LoRA) gets the
  LoRA adapter folder the trainer writes under `<run_dir>/lora_adapters/v<version>`;
- a trainer whose `weights_for_engine()` is None (trainer=function) syncs nothing;
- any other engine is an error (the pre-flight check refuses such a config before it runs).
Called after every `train`, and after a resumed trainer's `load` (the engine restarts with the
checkpoint's weights and must serve the restored ones before the next rollout).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

__all__ = ["push_weights"]

logger = logging.getLogger(__name__)


def push_weights(trainer: Any, engine: Any, run_dir: str | None) -> dict[str, float]:
    """Send the trainer's current weights to `engine`; returns {"perf/weight_sync_time": s}
    (empty when nothing was sent)."""
    if engine is None:
        return {}
    start = time.perf_counter()
    version = int(trainer.weight_version)
    update = getattr(engine, "update_weights", None)
    update_lora = getattr(engine, "update_lora", None)
    if callable(update):
        state = trainer.weights_for_engine()
        if state is None:
            return {}
        update(state, version)
    elif callable(update_lora) and callable(getattr(trainer, "save_lora_adapter", None)):
        if run_dir is None:
            raise RuntimeError("weight sync through update_lora needs a run dir for the adapter folders")
        folder = trainer.save_lora_adapter(str(Path(run_dir) / "lora_adapters" / f"v{version}"))
        update_lora(folder, version)
    elif trainer.weights_for_engine() is None:
        return {}
    else:
        raise RuntimeError(f"engine {type(engine).__name__} cannot take the trainer's weights (no update_weights"
                           f" or update_lora); use engine=hf, ray or sglang, or trainer=none")
    logger.info("engine now serves weight version %d", version)
    return {"perf/weight_sync_time": time.perf_counter() - start}
