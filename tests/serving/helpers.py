"""Shared set-up of the serving tests: a composed run config and the dumped samples."""

from __future__ import annotations

import json
from pathlib import Path

from hydra import compose, initialize_config_dir

from pipeline.sinks.files import read_samples

CONF = Path(__file__).resolve().parents[2] / "conf"
GEN = "tests.serving.slime_style_generate."


def write_data(tmp_path: Path, n: int = 8) -> Path:
    path = tmp_path / "arith.jsonl"
    path.write_text("".join(json.dumps({"input": f"What is {i} + {i + 2}?", "label": str(2 * i + 2)}) + "\n"
                            for i in range(n)))
    return path


def compose_run(tmp_path: Path, *extra: str, engine: str = "scripted"):
    """A 1-rollout run of the slime-style HTTP generate (and its reward) on `engine`."""
    overrides = [f"paths.output_dir={tmp_path}/run", f"data_source.prompt_data={write_data(tmp_path)}",
                 f"engine={engine}", "rollout_batch_size=2", "n_samples_per_prompt=2", "num_rollout=1",
                 "rollout_max_response_len=64", "logger=jsonl", "allowed_targets_extra=[tests.]",
                 f"rollout.custom_generate_path={GEN}generate", "reward=custom",
                 f"reward.custom_rm_path={GEN}reward", "rollout.progress=false", "rollout.summary=false",
                 "data_source.apply_chat_template=false", *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def samples_of(tmp_path: Path, rollout_id: int = 0) -> list:
    return read_samples(tmp_path / "run" / "samples" / f"rollout_{rollout_id}.jsonl")


def masked_spans(sample) -> list[tuple[int, int]]:
    """(start, length) of each run of loss mask 0 in the response."""
    spans, start = [], None
    for i, m in enumerate([*sample.loss_mask, 1]):
        if m == 0 and start is None:
            start = i
        elif m == 1 and start is not None:
            spans.append((start, i - start))
            start = None
    return spans
