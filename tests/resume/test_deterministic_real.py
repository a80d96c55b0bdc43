"""Deterministic mode on the real model: 1 and 2 Ray replicas give byte-identical sample dumps
(tiny: 2 rollouts, batch 2, n 2, 8 tokens), log-probs included.

The hf engine samples each row with its own seeded generator, so tokens do not depend on the
batch a row shares; deterministic mode also asks it for batch-invariant log-probs (each finished
sample's recomputed alone), since batched float32 logits differ in their last bits (~1e-5)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import harness  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_one_and_two_ray_replicas_give_identical_dumps(tmp_path):
    data = harness.write_prompts(tmp_path / "p.jsonl", 8)
    common = [
        "engine=ray", "engine.num_cpus=2", "engine.threads_per_replica=1", "data_source=buffered",
        f"data_source.prompt_data={data}", "data_source.label_key=label", "data_source.apply_chat_template=true",
        "rollout_batch_size=2", "over_sampling_batch_size=3", "n_samples_per_prompt=2",
        "rollout_max_response_len=8", "num_rollout=2", "partial_rollout=true", "logger=jsonl",
        "rollout.progress=false", "rollout.summary=false", "rollout.deterministic=true",
    ]
    dirs = {k: tmp_path / f"replicas{k}" for k in (1, 2)}
    for k, run_dir in dirs.items():
        harness.run_to_end(common + [f"engine.num_replicas={k}", f"hydra.run.dir={run_dir}"], timeout=200)
    for r in range(2):
        one, two = ((d / "samples" / f"rollout_{r}.jsonl").read_bytes() for d in dirs.values())
        assert one == two, f"rollout {r} dumps differ"
        samples = harness.read_dump(dirs[1] / "samples" / f"rollout_{r}.jsonl")
        assert len(samples) == 4 and all(s["response_length"] > 0 for s in samples)
        assert all(len(s["rollout_log_probs"]) == s["response_length"] for s in samples)
