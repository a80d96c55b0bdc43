"""The Sample (docs/contracts.md §1): `sample.Sample`, its status and counters (`meta`) and the
version upgrades of stored samples (`versions`)."""
