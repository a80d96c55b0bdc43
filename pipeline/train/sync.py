"""Weight sync after a trainer update: the engine serves the trainer's weights at its version.

`push_weights(trainer, engine, run_dir)`:
- an engine with `update_lora(adapter_path, version)` and `weight_sync = "lora"` (openai, vLLM
  runtime LoRA; or one with update_lora only) gets the LoRA adapter folder the trainer writes
  under `<run_dir>/lora_adapters/v<version>` (the newest LORA_ADAPTERS_KEPT folders are kept:
  the served adapter and the one before it);
- else an engine with `update_weights(state, version)` (hf, ray, sglang, scripted) gets
  `trainer.weights_for_engine()` (full HF names, LoRA merged) and `trainer.weight_version`; an
  engine that `takes_object_refs` (ray) gets a distributed trainer's `weights_ref_for_engine()`,
  the Ray object rank 0 gathered the weights into;
- a trainer whose `weights_for_engine()` is None (trainer=function) syncs nothing;
- any other engine is an error (the pre-flight check refuses such a config before it runs).
Called after every `train`, and after a resumed trainer's `load` (the engine restarts with the
checkpoint's weights and must serve the restored ones before the next rollout).
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

from pipeline.process.atomic import prune_numbered_dirs, remove_stale_temp_dirs

__all__ = ["LORA_ADAPTERS_KEPT", "push_weights"]

logger = logging.getLogger(__name__)

# adapter folders kept under <run>/lora_adapters/ (the server loaded the older ones already and
# unloads them once the next version is served)
LORA_ADAPTERS_KEPT = 2
_ADAPTER = re.compile(r"v(\d+)")


def push_weights(trainer: Any, engine: Any, run_dir: str | None) -> dict[str, float]:
    """Send the trainer's current weights to `engine`; returns {"perf/weight_sync_time": s}
    (empty when nothing was sent)."""
    if engine is None:
        return {}
    start = time.perf_counter()
    version = int(trainer.weight_version)
    update = getattr(engine, "update_weights", None)
    update_lora = getattr(engine, "update_lora", None)
    # an engine that declares weight_sync = "lora" (openai) takes adapters even though it has an
    # update_weights (which refuses full weights)
    lora = callable(update_lora) and (getattr(engine, "weight_sync", None) == "lora" or not callable(update))
    if lora and callable(getattr(trainer, "save_lora_adapter", None)):
        if run_dir is None:
            raise RuntimeError("weight sync through update_lora needs a run dir for the adapter folders")
        root = Path(run_dir) / "lora_adapters"
        remove_stale_temp_dirs(root, "v*")
        folder = trainer.save_lora_adapter(str(root / f"v{version}"))
        update_lora(folder, version)
        prune_numbered_dirs(root, _ADAPTER, LORA_ADAPTERS_KEPT)
    else:
        by_ref = getattr(engine, "takes_object_refs", False) and callable(getattr(trainer, "weights_ref_for_engine",
                                                                                  None))
        # a distributed trainer's gathered weights sit in Ray's object store: engine=ray's
        # replicas read that one object (no copy through this process)
        state = trainer.weights_ref_for_engine() if by_ref else trainer.weights_for_engine()
        if state is None:
            return {}
        if lora or not callable(update):
            raise RuntimeError(f"engine {type(engine).__name__} cannot take the trainer's weights (no update_weights"
                               f" or update_lora); use engine=hf, ray or sglang, or trainer=none")
        update(state, version)
    logger.info("engine now serves weight version %d", version)
    return {"perf/weight_sync_time": time.perf_counter() - start}

