"""Command line: `python run.py [group=option ...] [key=value ...]` (Hydra).

`python run.py --help` lists the config groups and options; `--cfg job` prints the config;
`-m` runs a sweep (one job per combination, a summary table in the sweep dir at the end).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from pipeline.app import run


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Run the pipeline for one composed config (one job of a sweep)."""
    run(cfg)


if __name__ == "__main__":
    main()
