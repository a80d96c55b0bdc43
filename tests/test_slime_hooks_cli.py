"""slime's rollout-side hooks through the CLI, each with a plugin in slime's exact signature
(tests/plugins/slime_hooks.py): when each is called (which samples, which rollout_id, train or
eval), custom generates that do not name `evaluation` or are synchronous, a slime-style data
source class, slime's reward dispatcher as the custom reward, and unset slime args."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from pipeline.sinks.files import load_train_data, read_samples
from pipeline.sinks.jsonl import read_metrics
from test_cli import ROOT, base, run_cli

HOOKS = "tests.plugins.slime_hooks."


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hooks_data")
    rows = [{"input": f"What is {i} + {2 * i + 3}?", "label": str(3 * i + 3)} for i in range(40)]
    (d / "arith.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    return d


def hook_log(log_dir: Path, hook: str) -> list[dict]:
    path = log_dir / f"{hook}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def common(data: Path, tmp: Path, engine_rollout: bool = True) -> list[str]:
    (tmp / "hooks").mkdir(exist_ok=True)
    return base(data / "arith.jsonl", engine_rollout) + ["logger=jsonl", "allowed_targets_extra=[tests.]", "num_rollout=2",
                                         f"+hook_log_dir={tmp / 'hooks'}", f"hydra.run.dir={tmp / 'run'}"]


def test_engine_rollout_hooks_run_in_slimes_order_with_slimes_arguments(data, tmp_path):
    """Sample hooks after generation and before the reward (train and eval, both rollouts, in
    list order), the sample filter then the all-samples process (dropped groups included), the
    data post-process on the train data before it is written; slime's async_rm as the reward."""
    run_cli(common(data, tmp_path) + [
        f"rollout_sample_hook_path=[{HOOKS}stamp_sample,{HOOKS}replace_sample]",
        f"rollout_sample_filter_path={HOOKS}remove_odd_groups",
        f"rollout_all_samples_process_path={HOOKS}all_samples_process",
        f"rollout_data_postprocess_path={HOOKS}rollout_data_postprocess",
        "dynamic_filter=nonzero_std", "eval=engine", "eval_interval=1",
        f"eval.datasets.0.prompt_data={data / 'eval.jsonl'}", "eval.progress=false", "eval.summary=false",
        "reward=custom", f"reward.custom_rm_path={HOOKS}async_rm", "reward.rm_type=boxed_math",
    ])
    run, logs = tmp_path / "run", tmp_path / "hooks"
    metrics = read_metrics(run / "metrics.jsonl")
    hooked = hook_log(logs, "sample_hook")
    assert hooked and all(h["reward_was_none"] for h in hooked)  # before the reward
    assert all(h["response_length"] > 0 for h in hooked)  # after generation
    by_call = defaultdict(set)
    for h in hooked:
        by_call[(h["rollout_id"], h["evaluation"])].add(h["index"])
    assert {k for k in by_call} == {(0, False), (1, False), (0, True), (1, True)}
    for rid in (0, 1):
        kept = read_samples(run / "samples" / f"rollout_{rid}.jsonl")
        assert {s.index for s in kept} <= by_call[(rid, False)]
        assert all(s.metadata["hooks"] == ["stamp", "replace"] for s in kept)
        for s in kept:  # slime's dispatcher graded them (no recursion): boxed answer == label
            boxed = re.findall(r"\\boxed\{([^{}]*)\}", s.response)
            assert s.reward == int(bool(boxed) and boxed[-1].strip() == s.label)
        evals = read_samples(run / "samples" / f"eval_math_{rid}.jsonl")
        assert {s.index for s in evals} == by_call[(rid, True)]
        assert all(s.metadata["hooks"] == ["stamp", "replace"] for s in evals)

    processed = hook_log(logs, "all_samples")
    assert len(processed) == 2
    assert any(k.startswith("rollout/dynamic_filter/drop_") for row in metrics for k in row)  # some were dropped
    for rid, call in enumerate(processed):
        kept = read_samples(run / "samples" / f"rollout_{rid}.jsonl")
        kept_groups = sorted({tuple(s.index for s in kept if s.group_index == g) for g in {s.group_index for s in kept}})
        dropped = sum(v for k, v in metrics[rid].items() if k.startswith("rollout/dynamic_filter/drop_"))
        assert len(call["groups"]) == len(kept_groups) + dropped  # dropped groups too
        assert set(kept_groups) <= {tuple(g) for g in call["groups"]}
        assert call["groups"] == sorted(call["groups"])  # by index
        # the sample filter ran first: the odd groups it marked show as removed
        assert call["removed"] == sorted(s.index for s in kept if s.group_index % 2 == 1)
        assert call["has_buffer_api"]

    post = hook_log(logs, "postprocess")
    assert [p["rollout_id"] for p in post] == [0, 1] and all("rewards" in p["keys"] for p in post)
    for rid in (0, 1):
        train = load_train_data(run / "train_data" / f"rollout_{rid}")
        assert train["postprocessed_rollout_id"] == [rid] * len(train["tokens"])
        assert post[rid]["rewards"] == pytest.approx(train["rewards"])


def test_function_rollout_with_slime_data_source_and_eval_log_hook(data, tmp_path):
    """data_source_path builds the class as slime does (`cls(args)`); the eval log hook gets
    (rollout_id, args, data, extra_metrics) and True drops the default eval metrics; the older
    args-only post-process form works; all-samples gets the kept groups of a plain rollout fn."""
    run_cli(common(data, tmp_path, engine_rollout=False) + [
        "rollout=function", "rollout.path=tests.plugins.slime_plugins.generate_rollout",
        "eval=function", "eval.path=tests.plugins.slime_plugins.generate_rollout", "eval_interval=1",
        f"data_source_path={HOOKS}ListDataSource",
        f"custom_eval_rollout_log_function_path={HOOKS}eval_log",
        f"rollout_data_postprocess_path={HOOKS}rollout_data_postprocess_args_only",
        f"rollout_all_samples_process_path={HOOKS}all_samples_process",
    ])
    run, logs = tmp_path / "run", tmp_path / "hooks"
    for rid in (0, 1):
        kept = read_samples(run / "samples" / f"rollout_{rid}.jsonl")
        assert kept and all(s.metadata["from"] == "ListDataSource" for s in kept)
    assert [r["save"] for r in hook_log(logs, "data_source")] == [0, 1]
    assert [r["rollout_id"] for r in hook_log(logs, "eval_log")] == [0, 1]
    assert all(r["datasets"] == ["toy"] and r["n"] == {"toy": 6} for r in hook_log(logs, "eval_log"))
    assert len(hook_log(logs, "postprocess_old")) == 2
    for rid, call in enumerate(hook_log(logs, "all_samples")):
        kept = read_samples(run / "samples" / f"rollout_{rid}.jsonl")
        assert sorted(i for g in call["groups"] for i in g) == sorted(s.index for s in kept)
    for row in read_metrics(run / "metrics.jsonl"):
        assert row["eval/hooked_mean"] == pytest.approx(2 / 6)  # every third toy sample is right
        assert not any(k.startswith("eval/toy") for k in row)  # the hook returned True


def test_custom_generates_get_evaluation_only_by_name(data, tmp_path):
    """`async def generate(args, sample, sampling_params, max_turns=3)` is called without
    `evaluation`; one that names it gets True in eval and nothing else changes."""
    run_cli(common(data, tmp_path) + [
        f"rollout.custom_generate_path={HOOKS}generate_multi_turn", "eval=engine", "eval_interval=2",
        f"eval.datasets.0.prompt_data={data / 'eval.jsonl'}", "eval.progress=false", "eval.summary=false",
        f"eval.custom_generate_path={HOOKS}generate_with_evaluation",
    ])
    run = tmp_path / "run"
    for rid in (0, 1):
        kept = read_samples(run / "samples" / f"rollout_{rid}.jsonl")
        assert kept and all(s.metadata["max_turns"] == 3 and s.response.startswith("turns=3") for s in kept)
    evals = read_samples(run / "samples" / "eval_math_1.jsonl")
    assert len(evals) == 3 and all(s.metadata["evaluation"] is True for s in evals)


def test_synchronous_custom_generate_works(data, tmp_path):
    run_cli(common(data, tmp_path) + [f"rollout.custom_generate_path={HOOKS}generate_sync"])
    run = tmp_path / "run"
    for rid, row in enumerate(read_metrics(run / "metrics.jsonl")):
        kept = read_samples(run / "samples" / f"rollout_{rid}.jsonl")
        assert all(s.metadata["sync"] and s.response.startswith("sync answer") for s in kept)
        truncated = [s.index % 2 == 1 for s in kept]
        assert [s.status.value for s in kept] == ["truncated" if t else "completed" for t in truncated]
        assert row["rollout/truncated_ratio"] == pytest.approx(sum(truncated) / len(kept))


def run_failing(args: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "WANDB_MODE": "offline"})
    assert proc.returncode != 0, proc.stdout[-2000:]
    return proc


def test_an_unset_slime_arg_names_the_key_and_how_to_set_it(data, tmp_path):
    proc = run_failing(common(data, tmp_path, engine_rollout=False) + ["rollout=function", f"rollout.path={HOOKS}rollout_needing_loss_mask_type"])
    assert "args has no attribute 'loss_mask_type'" in proc.stderr
    assert "+loss_mask_type=<value>" in proc.stderr and "slime_args:" in proc.stderr


def test_a_bad_sample_hook_stops_the_run_naming_it(data, tmp_path):
    proc = run_failing(common(data, tmp_path) + [f"rollout_sample_hook_path=[{HOOKS}bad_sample_hook]"])
    assert f"rollout sample hook '{HOOKS}bad_sample_hook' returned dict" in proc.stderr


@pytest.mark.slow
def test_slime_sft_rollout_loads_hf_checkpoint_as_a_folder(tmp_path):
    """A slime sft_rollout-style plugin loads args.hf_checkpoint with from_pretrained (the real
    tokenizer, offline: no hub retries) with only documented keys added (+loss_mask_type)."""
    from transformers import AutoTokenizer

    chat = [{"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": f"{w}!"}]}
            for w in ("hello", "bye", "yes", "no")]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    (tmp_path / "hooks").mkdir()
    run_cli(["engine=scripted", "logger=jsonl", "allowed_targets_extra=[tests.]", "num_rollout=2",
             "rollout_batch_size=2", "n_samples_per_prompt=1", "advantage=none",
             f"data_source.prompt_data={tmp_path / 'chat.jsonl'}", "data_source.input_key=messages",
             "data_source.label_key=null", "data_source.apply_chat_template=false",
             "rollout=function", "rollout.path=tests.plugins.slime_sft.generate_rollout",
             "+loss_mask_type=prefix", f"+hook_log_dir={tmp_path / 'hooks'}", f"hydra.run.dir={tmp_path / 'run'}"],
            HF_HUB_OFFLINE="0")
    (loaded,) = hook_log(tmp_path / "hooks", "sft")
    folder = Path(loaded["hf_checkpoint"])
    assert (folder / "config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    for rid in (0, 1):
        train = load_train_data(tmp_path / "run" / "train_data" / f"rollout_{rid}")
        for tokens, length, mask in zip(train["tokens"], train["response_lengths"], train["loss_masks"]):
            response = tokenizer.decode(tokens[len(tokens) - length:])
            assert any(f"{w}!" in response for w in ("hello", "bye", "yes", "no")) and sum(mask) > 0
