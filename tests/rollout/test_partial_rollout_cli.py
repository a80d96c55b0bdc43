"""The buffer tour command on the real model, as a user types it:

    python run.py data_source=buffered filter=reward_topk dynamic_filter=nonzero_std partial_rollout=true

with 5 rollouts instead of 3 (4 groups x 4 samples, 48 tokens each). Which groups finish in the
decode step that fills the batch is a matter of timing, so one rollout may show no surplus or no
abort (a run of 3 nearly always shows both); over 5 rollouts `metrics.jsonl` must show dynamic-filter drops, groups aborted to
the buffer and continued (not restarted) later, and completed surplus groups carried over and
reused. The continuation is checked token by token: the partial response a checkpoint holds for
a sample is the start of that sample's response in the next rollout's dump.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.samples.sample import Sample
from pipeline.sinks.jsonl import read_metrics

sys.path.insert(0, str(Path(__file__).parents[1] / "resume"))
import harness  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(700)]

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ["data_source=buffered", "filter=reward_topk", "dynamic_filter=nonzero_std", "partial_rollout=true"]
ROLLOUTS = 5


def partial_samples(run_dir: Path, rollout_id: int) -> dict[int, list[int]]:
    """index -> token ids (prompt + partial response) of the aborted samples with a partial
    response in the buffer of checkpoint `rollout_id`."""
    src = harness.load_source(run_dir, ROOT / "data" / "math_train.jsonl", 4, rollout_id)
    return {s.index: list(s.tokens) for g in src.buffer for s in g
            if s.status == Sample.Status.ABORTED and s.response_length > 0}


def test_the_buffer_tour_command_shows_drops_aborts_continuations_and_surplus(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "run.py", *COMMAND, f"num_rollout={ROLLOUTS}", "rollout.progress=false",
                           f"data_source.keep_checkpoints={ROLLOUTS}",
                           f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(ROLLOUTS))
    # rounds of over_sampling_factor 4 x rollout_batch_size 4 groups
    assert rows[0]["rollout/groups_fetched"] == 16 * rows[0]["rollout/fetch_rounds"] > 0

    def total(key: str) -> float:
        return sum(r[key] for r in rows)

    def continued() -> int:
        """Samples aborted in rollout r and continued from r + 1 on: the first later dump that holds
        one has the same tokens, then more (staleness counts weight versions: with no trainer
        nothing is stale, so nothing is regenerated instead); every rollout of `rows` counts."""
        done = len(rows)
        dumps = {r: {s["index"]: s for s in map(json.loads, (run_dir / "samples" / f"rollout_{r}.jsonl")
                                                   .read_text().splitlines())} for r in range(done)}
        checked = 0
        for r in range(done - 1):
            partial = partial_samples(run_dir, r) if rows[r]["rollout/aborted_groups_to_buffer"] else {}
            if partial:
                assert rows[r + 1]["rollout/continued_samples"] > 0
            for index, before in partial.items():
                # the first later batch that holds it (a continued sample may finish as surplus and
                # be served from the buffer a rollout later, e.g. behind better groups of reward_topk)
                later = next((dumps[k][index] for k in range(r + 1, done) if index in dumps[k]), None)
                if later is not None:
                    after = later["tokens"]
                    assert after[: len(before)] == before, f"sample {index} was restarted, not continued"
                    assert len(after) > len(before)
                    checked += 1
        return checked

    surplus = total("rollout/surplus_groups_carried") > 0 and total("rollout/surplus_groups_reused") > 0
    if not surplus or not continued():
        # no surplus, or no continuation served, in 5 rollouts' timing (each seen once in CI):
        # resume the run, as a user would, for 3 more; the resumed rollouts count too
        more = subprocess.run([sys.executable, "run.py", f"resume={run_dir}", f"num_rollout={ROLLOUTS + 3}",
                               "allow_config_change=true",
                               f"data_source.keep_checkpoints={ROLLOUTS + 3}"],  # keep the first 5 to read
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert more.returncode == 0, more.stderr[-4000:]
        rows = read_metrics(run_dir / "metrics.jsonl")
        assert [r["step"] for r in rows] == list(range(ROLLOUTS + 3))
    assert sum(v for r in rows for k, v in r.items() if k.startswith("rollout/dynamic_filter/drop_")) > 0
    assert total("rollout/surplus_groups_carried") > 0 and total("rollout/surplus_groups_reused") > 0
    assert continued() > 0, "no aborted sample with a partial response was continued in a later rollout"
