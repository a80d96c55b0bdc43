"""The trainer on torch.distributed: `trainer.num_workers` > 1 runs N workers (Ray actors, one
per device) in one process group, FSDP2 or DDP (`strategy`), driven by `driver.DistributedTrainer`
from the pipeline's process. `split` deals the samples out, `group` places and watches the
workers, `worker` is one rank, `strategy` its process group's answers, `shards` its weights and
checkpoints."""
