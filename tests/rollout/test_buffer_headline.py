"""The buffer of `python run.py data_source=buffered filter=reward_topk` (issue 10, item 4).

A buffered source over-samples by default (`over_sampling_factor`), the completed
surplus of a round goes to the buffer, and the next rollout is served from it first, best mean
reward first (`filter=reward_topk`); groups fetched but aborted before anything was generated go
back as fresh prompts instead of being lost. The plain default is unchanged. A combination that
can never put a group into the buffer is a pre-flight warning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from pipeline.run.app import run
from pipeline.config.args import validate
from pipeline.data.buffer_filters import group_mean_reward, reward_topk
from pipeline.engines.scripted import ScriptedEngine
from pipeline.process.logging_setup import RunProgress
from pipeline.samples.sample import Sample
from pipeline.sinks.jsonl import read_metrics

from rollout_helpers import make_args

pytestmark = pytest.mark.timeout(120)

CONF = Path(__file__).resolve().parents[2] / "conf"
HEADLINE = ["data_source=buffered", "filter=reward_topk"]


def compose_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def completed_group(src: Any, rewards: list[float], start: int = 0) -> list[Sample]:
    """A fresh group of `src`, finished with the given rewards at rollout `start`."""
    group = src.get_samples(1)[0]
    for s, r in zip(group, rewards):
        s.tokens = s.tokens or [1, 2, 3]
        s.response, s.response_length, s.reward = "\\boxed{0}", 1, r
        s.tokens = list(s.tokens) + [7]
        s.status = Sample.Status.COMPLETED
        s.metadata["start_rollout_id"] = start
    return group


def test_buffered_source_over_samples_and_the_plain_default_does_not():
    assert compose_cfg().over_sampling_batch_size == 4  # rollout_batch_size, as before
    assert compose_cfg(*HEADLINE).over_sampling_batch_size == 12
    # the tour's step 4 command (README, docs/getting-started.md) keeps the dynamic filter's factor 4
    assert compose_cfg(*HEADLINE, "dynamic_filter=nonzero_std", "partial_rollout=true").over_sampling_batch_size == 16
    assert compose_cfg(*HEADLINE, "over_sampling_factor=1").over_sampling_batch_size == 4
    assert compose_cfg(*HEADLINE, "rollout_batch_size=3", "over_sampling_factor=1.5") \
        .over_sampling_batch_size == 5


@pytest.mark.parametrize("finish_surplus", [True, False])
def test_the_buffer_serves_its_best_groups_first_and_keeps_the_rest(make_rollout, make_source, finish_surplus):
    src = make_source(n=2, buffered=True, buffer_filter=reward_topk)
    means = [0.0, 1.0, 0.5, 0.0, 1.0, 0.5, 0.5, 0.0]
    groups = [completed_group(src, [m, m]) for m in means]
    src.add_samples(groups)
    by_mean = sorted(range(8), key=lambda i: (-means[i], i))
    best = {groups[i][0].group_index for i in by_mean[:4]}
    args = make_args(rollout_batch_size=4, n_samples_per_prompt=2, over_sampling_batch_size=12)
    # slow tokens: the 4 fresh groups of the round are still waiting when the buffered ones fill the batch
    rollout = make_rollout(engine=ScriptedEngine(token_delay=0.05), finish_surplus=finish_surplus)
    out = rollout(args, 1, src)
    assert {g[0].group_index for g in out.samples} == best
    m = out.metrics
    assert m["rollout/groups_from_buffer"] == 8 and m["rollout/surplus_groups_reused"] >= 4
    assert m["rollout/groups_to_buffer"] == 8 == m["rollout/buffer_size"] == len(src.buffer)
    assert m["rollout/aborted_groups_dropped"] == 0
    left = [g for g in src.buffer if g[0].metadata.get("start_rollout_id") == 0]
    assert len(left) == 4 and max(group_mean_reward(args, g) for g in left) <= min(
        group_mean_reward(args, g) for g in out.samples)
    fresh = [g for g in src.buffer if g[0].metadata.get("start_rollout_id") != 0]
    assert len(fresh) == 4
    if finish_surplus:  # the fresh groups finished generating: completed surplus for the next rollout
        assert m["rollout/surplus_groups_finished"] == 4 and m["rollout/surplus_groups_carried"] == 8
        assert all(s.status == Sample.Status.COMPLETED and s.response_length > 0 for g in fresh for s in g)
        assert all(s.metadata["start_rollout_id"] == 1 for g in fresh for s in g)
    else:  # aborted before their first token: back unchanged, not dropped
        assert m["rollout/aborted_groups_restarted"] == 4 and m["rollout/surplus_groups_carried"] == 4
        assert all(s.response_length == 0 and s.reward is None for g in fresh for s in g)


def test_console_line_shows_the_buffer_traffic_and_the_default_line_is_unchanged(caplog, tmp_path):
    progress = RunProgress(2, str(tmp_path))
    with caplog.at_level(logging.INFO, logger="pipeline.progress"):
        progress.step(0, {"rollout/buffer_size": 8.0, "rollout/groups_to_buffer": 8, "rollout/groups_from_buffer": 0})
        progress.step(1, {"rollout/buffer_size": 0.0, "rollout/groups_to_buffer": 0, "rollout/groups_from_buffer": 0})
    lines = [r.getMessage() for r in caplog.records]
    assert "| buffer 8 (+8 -0) |" in lines[0]
    assert "| buffer 0 |" in lines[1]
    assert "| 0 | - | - | - | - | 8 (+8 -0) | - |" in progress.summary()


def test_headline_command_fills_the_buffer_and_serves_it(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": f"What is {i} + 3?", "label": str(i + 3)}) + "\n" for i in range(40)))
    cfg = compose_cfg(*HEADLINE, f"paths.output_dir={tmp_path}/run", f"data_source.prompt_data={data}", "engine=scripted",
                      "logger=jsonl", "num_rollout=4", "rollout.progress=false", "data_source.apply_chat_template=false",
                      "engine.token_delay=0.002")
    run(cfg)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["rollout/groups_fetched"] for r in rows[:1]] == [12]
    assert rows[0]["rollout/groups_to_buffer"] > 0 and rows[0]["rollout/buffer_size"] > 0
    assert rows[1]["rollout/groups_from_buffer"] > 0 and rows[1]["rollout/surplus_groups_reused"] > 0


@pytest.mark.parametrize("overrides,warned", [
    ([], False),
    (HEADLINE, False),
    ([*HEADLINE, "over_sampling_factor=1"], True),
    ([*HEADLINE, "rollout.carry_surplus=false"], True),
    ([*HEADLINE, "over_sampling_factor=1", "partial_rollout=true"], False),
    ([*HEADLINE, "over_sampling_factor=1", "dynamic_filter=nonzero_std"], False),
    ([*HEADLINE, "rollout.over_sampling=adaptive"], True),
])
def test_preflight_warns_when_nothing_can_enter_the_buffer(overrides, warned, caplog, tmp_path):
    with caplog.at_level(logging.WARNING, logger="pipeline.config.args"):
        validate(compose_cfg(*overrides, f"paths.output_dir={tmp_path}"))
    found = [r.getMessage() for r in caplog.records if "nothing will ever enter the buffer" in r.getMessage()]
    assert bool(found) == warned, found


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_headline_command_on_the_real_model_serves_the_buffer_best_first(tmp_path):
    """`python run.py data_source=buffered filter=reward_topk` as typed (2 rollouts, 32 tokens):
    rollout 0 generates 3 batches' worth and buffers the completed surplus; rollout 1 is served
    from the buffer, the groups with the best mean reward first."""
    import os
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "resume"))
    import harness

    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "run"
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "run.py", *HEADLINE, "num_rollout=2", "rollout_max_response_len=32",
                           "rollout.progress=false", f"hydra.run.dir={run_dir}"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows[0]["rollout/groups_fetched"] == 12 and rows[0]["rollout/groups_from_buffer"] == 0
    assert rows[0]["rollout/groups_to_buffer"] == rows[0]["rollout/buffer_size"] > 0
    assert rows[1]["rollout/groups_from_buffer"] > 0 and rows[1]["rollout/surplus_groups_reused"] > 0
    assert "(+" in proc.stderr + proc.stdout  # the console line shows the buffer traffic

    def mean(group: list[Sample]) -> float:
        return sum(s.reward for s in group) / len(group)

    data = root / "data" / "math_train.jsonl"
    buffered = {g[0].group_index: mean(g) for g in harness.load_source(run_dir, data, 4, 0).buffer
                if all(s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) for s in g)}
    kept = {json.loads(line)["group_index"] for line in (run_dir / "samples" / "rollout_1.jsonl").read_text().splitlines()}
    served = kept & set(buffered)
    left = set(buffered) & {g[0].group_index for g in harness.load_source(run_dir, data, 4, 1).buffer}
    assert served, f"rollout 1 used none of the buffered groups {buffered}"
    assert not left or min(buffered[g] for g in served) >= max(buffered[g] for g in left), (buffered, served, left)
