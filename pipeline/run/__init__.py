"""The run and its identity: `app.run(cfg)` composes a run from its parts (docs/contracts.md §9);
`session` resolves `resume=` before Hydra composes; `run_record` / `run_lock` / `sweep_resume`
keep who the run is; `overrides` reads the command line."""
