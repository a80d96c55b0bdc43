"""`trainer=policy_gradient`'s target: the trainer in this process, or the driver of N workers.

`trainer.num_workers` 1 builds `PolicyGradientTrainer` (one process, today's path); N > 1 builds
`DistributedTrainer` (N torch.distributed workers on Ray, `pipeline.train.distributed`). Both
take the same keys and answer the pipeline the same way (train, weight_version,
weights_for_engine, save_lora_adapter, export_hf, save, load).
"""

from __future__ import annotations

from typing import Any

from pipeline.train.distributed.driver import DistributedTrainer
from pipeline.train.policy_gradient import PolicyGradientTrainer

__all__ = ["policy_gradient_trainer"]


def policy_gradient_trainer(*, args: Any = None, **keys: Any) -> PolicyGradientTrainer | DistributedTrainer:
    """The trainer `keys` (conf/trainer/policy_gradient.yaml) describe (module docstring)."""
    if keys["num_workers"] == 1:
        return PolicyGradientTrainer(args=args, **keys)
    return DistributedTrainer(args=args, **keys)
