"""`trainer=policy_gradient`'s target: the trainer in this process, or the driver of N workers.

`trainer.num_workers` 1 builds `PolicyGradientTrainer` (one process, today's path); N > 1 builds
`DistributedTrainer` (N torch.distributed workers on Ray, `pipeline.train.distributed`). Both
take the same keys and answer the pipeline the same way (train, weight_version,
weights_for_engine, save_lora_adapter, export_hf, save, load, and `keep_states`: how many trainer
states the run dir keeps). Before either is built, the disk the trainer states and the policy
export will take is logged (`pipeline.train.disk.log_disk_estimate`) when the run dir is known.
"""

from __future__ import annotations

from typing import Any

from pipeline.train.disk import log_disk_estimate
from pipeline.train.distributed.driver import DistributedTrainer
from pipeline.train.policy_gradient import PolicyGradientTrainer

__all__ = ["policy_gradient_trainer"]


def policy_gradient_trainer(*, args: Any = None, **keys: Any) -> PolicyGradientTrainer | DistributedTrainer:
    """The trainer `keys` (conf/trainer/policy_gradient.yaml) describe (module docstring)."""
    run_dir = _run_dir(args)
    if run_dir is not None:
        log_disk_estimate(keys, run_dir)
    trainer: PolicyGradientTrainer | DistributedTrainer
    if keys["num_workers"] == 1:
        trainer = PolicyGradientTrainer(args=args, **keys)
    else:
        trainer = DistributedTrainer(args=args, **keys)
    trainer.keep_states = int(keys["keep_states"])
    return trainer


def _run_dir(args: Any) -> str | None:
    """The run dir (`paths.output_dir` of the run's args); None when built without a run."""
    if args is None:
        return None
    plain = args.as_dict() if hasattr(args, "as_dict") else dict(vars(args))
    paths = plain.get("paths")
    return paths.get("output_dir") if isinstance(paths, dict) else None
