"""The per-rollout loop: `parts` builds a run's parts from the slot table, `runner` runs the
rollout loop with eval and checkpoint cadence, `runner_async` the train_async loop (§9, §14)."""
