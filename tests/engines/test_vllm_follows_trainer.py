"""Opt-in (`make test-vllm`): vLLM follows the trainer, on this CPU.

One vLLM server per module (`vllm_url`), started on the policy the trainer exported:
1. `trainer=policy_gradient` (full fine-tuning, real SmolLM2) takes one update on hand-made
   train data and writes `<run>/policy/` through `export_policy`, the function the pipeline
   calls after its last rollout; vLLM loads that folder and its greedy output equals the hf
   engine's on the same exported weights;
2. the server runs with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`; a LoRA
   trainer (trainer.lora_rank > 0) on that policy pushes its adapter through `push_weights` to
   the openai engine (`/v1/load_lora_adapter`); after each update the engine's greedy output is
   the trained policy's (the hf engine with the trainer's merged weights), the results carry the
   weight version, and the previous adapter is unloaded;
3. the whole loop through the CLI: `run.py engine=openai engine.lora_name=... trainer.lora_rank=8`
   against the server, two rollouts: weight versions 1 and 2, the second rollout's tokens made by
   version 1, the adapter folders written.

Selection as in test_openai_vllm.py: `-m vllm` with `.venv-vllm` built, never in CI.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from safetensors.torch import load_file

from pipeline.engines.hf import HFEngine
from pipeline.engines.openai import OpenAIEngine
from pipeline.stages.train import export_policy
from pipeline.train.policy_gradient import PolicyGradientTrainer
from pipeline.train.sync import push_weights
from tests.engines.conftest import chat_ids, request
from tests.engines.vllm_server import selected, serve
from tests.train.trainer_fixtures import yaml_keys

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ("What is 7 + 5?", "Name a colour.")
NEW_TOKENS = 8
LORA_RANK = 8

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]


@pytest.fixture(autouse=True)
def _opt_in(request: pytest.FixtureRequest) -> None:
    if not selected(request.config) or os.environ.get("VLLM_BASE_URL"):
        pytest.skip("opt-in: run `make test-vllm` (needs .venv-vllm; starts its own server on the exported policy)")


def greedy(engine: Any, tokenizer: Any, tag: str) -> list[list[int]]:
    """Greedy output ids of each question (NEW_TOKENS at most)."""
    async def all_of() -> list[Any]:
        return list(await asyncio.gather(*(engine.generate(request(tokenizer, f"{tag}{i}", q, temperature=0.0,
                                                                   max_new_tokens=NEW_TOKENS))
                                           for i, q in enumerate(QUESTIONS))))
    return [r.output_ids for r in asyncio.run(all_of())]


def train_data(tokenizer: Any, penalised: list[list[int]], rewarded: list[list[int]]) -> dict[str, Any]:
    """One group per question: its `penalised` response gets reward -1, its `rewarded` one +1."""
    tokens, lengths, rewards = [], [], []
    for q, bad, good in zip(QUESTIONS, penalised, rewarded, strict=True):
        for response, reward in ((bad, -1.0), (good, 1.0)):
            tokens.append(chat_ids(tokenizer, q) + response)
            lengths.append(len(response))
            rewards.append(reward)
    return {"tokens": tokens, "response_lengths": lengths, "loss_masks": [[1] * n for n in lengths],
            "rewards": rewards}


def sampled(engine: Any, tokenizer: Any, seed: int) -> list[list[int]]:
    async def all_of() -> list[Any]:
        return list(await asyncio.gather(*(engine.generate(request(tokenizer, f"s{i}", q, temperature=1.0,
                                                                   max_new_tokens=NEW_TOKENS, seed=seed + i))
                                           for i, q in enumerate(QUESTIONS))))
    return [r.output_ids for r in asyncio.run(all_of())]


@pytest.fixture(scope="module")
def exported(request: pytest.FixtureRequest, model_path: str, hf_engine: Any,
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`<run>/policy/` of a full fine-tuning trainer after one update that penalises the base
    model's greedy answers."""
    if not selected(request.config):
        pytest.skip("opt-in")
    run_dir = tmp_path_factory.mktemp("full_ft_run")
    tok = hf_engine.tokenizer
    trainer = PolicyGradientTrainer(**yaml_keys(hf_checkpoint=model_path, lr=1e-4, num_threads=2))
    trainer.train(0, train_data(tok, greedy(hf_engine, tok, "base"), sampled(hf_engine, tok, 11)))
    export_policy(trainer, str(run_dir))
    return run_dir / "policy"


@pytest.fixture(scope="module")
def vllm_url(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The one server of this module: the exported policy, runtime LoRA loading on."""
    with serve(str(exported), tmp_path_factory.mktemp("vllm_lora") / "vllm.log",
               ["--max-num-seqs", "8", "--enable-lora", "--max-lora-rank", str(LORA_RANK), "--max-loras", "1"],
               {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as url:
        yield url


@pytest.fixture(scope="module")
def local(exported: Path) -> Iterator[HFEngine]:
    """The hf engine (float32) on the exported policy: the reference for vLLM's greedy output."""
    engine = HFEngine(str(exported), num_threads=2, max_batch_size=4, dtype="float32")
    engine.start()
    yield engine
    engine.close()


def test_exported_policy_loads_in_vllm_and_matches_the_hf_engine(exported: Path, model_path: str, vllm_url: str,
                                                                 local: HFEngine, hf_engine: Any) -> None:
    trained = load_file(str(exported / "model.safetensors"))
    base = load_file(str(Path(model_path) / "model.safetensors"))
    assert any(not (trained[k] == base[k]).all() for k in base if k in trained), "the export is the base model"
    served = OpenAIEngine(vllm_url, model=str(exported), dialect="vllm", hf_checkpoint=str(exported))
    try:
        tok = local.tokenizer
        ours, theirs = greedy(local, tok, "hf"), greedy(served, tok, "vllm")
    finally:
        served.close()
    assert all(len(t) > 0 for t in theirs)
    assert [o[:len(t)] for o, t in zip(ours, theirs)] == theirs
    assert greedy(hf_engine, tok, "base") != ours, "one update should move the greedy answers"


def test_openai_engine_follows_a_lora_trainer(exported: Path, vllm_url: str, local: HFEngine,
                                              tmp_path: Path) -> None:
    tok = local.tokenizer
    engine = OpenAIEngine(vllm_url, model=str(exported), dialect="vllm", hf_checkpoint=str(exported),
                          lora_name="policy", request_timeout_s=300.0)
    trainer = PolicyGradientTrainer(**yaml_keys(hf_checkpoint=str(exported), lr=2e-3, lora_rank=LORA_RANK,
                                                num_threads=2))
    try:
        before = greedy(engine, tok, "v0")
        assert before == [o[:len(b)] for o, b in zip(greedy(local, tok, "hf0"), before)]
        seen = [before]
        for version in (1, 2):
            trainer.train(version - 1, train_data(tok, seen[-1], sampled(local, tok, 100 * version)))
            push_weights(trainer, engine, str(tmp_path))
            assert engine.weight_version == version and engine.model == f"policy-v{version}"
            local.update_weights(trainer.weights_for_engine(), version)
            results = asyncio.run(engine.generate(request(tok, f"w{version}", QUESTIONS[0], temperature=0.0,
                                                          max_new_tokens=NEW_TOKENS)))
            assert results.weight_versions == [version] * len(results.output_ids)
            served, ours = greedy(engine, tok, f"v{version}"), greedy(local, tok, f"hf{version}")
            assert [o[:len(s)] for o, s in zip(ours, served)] == served, f"version {version}"
            seen.append(served)
            assert (tmp_path / "lora_adapters" / f"v{version}" / "adapter_model.safetensors").is_file()
        assert seen[1] != seen[0] or seen[2] != seen[0], "the adapters never changed the greedy answers"
        models = [m["id"] for m in httpx.get(f"{vllm_url}/v1/models", timeout=10).json()["data"]]
        assert "policy-v2" in models and "policy-v1" not in models, models
    finally:
        engine.close()


def test_the_cli_loop_with_a_lora_trainer_against_vllm(exported: Path, vllm_url: str, tmp_path: Path) -> None:
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps({"input": f"What is {i} + {i + 2}?", "label": str(2 * i + 2)}) + "\n"
                            for i in range(8)))
    run = tmp_path / "run"
    args = ["engine=openai", f"engine.base_url={vllm_url}", "engine.dialect=vllm", f"engine.model={exported}",
            "engine.lora_name=cli", f"hf_checkpoint={exported}", f"data_source.path={data}", "reward=random",
            "rollout_batch_size=2", "n_samples_per_prompt=2", "rollout_max_response_len=4", "num_rollout=2",
            "logger=jsonl", "rollout.progress=false", "rollout.summary=false", "trainer=policy_gradient",
            f"trainer.lora_rank={LORA_RANK}", "trainer.lr=1e-3", f"hydra.run.dir={run}"]
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", HYDRA_FULL_ERROR="1")
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/weight_version"] for r in rows] == [1.0, 2.0]
    second = [json.loads(line) for line in (run / "samples" / "rollout_1.jsonl").read_text().splitlines()]
    assert second and all(s["weight_versions"] == ["1"] for s in second)
    assert sorted(p.name for p in (run / "lora_adapters").iterdir()) == ["v1", "v2"]
    assert (run / "policy" / "model.safetensors").is_file()
