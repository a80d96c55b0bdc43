"""slime's own examples/search-r1 generate and reward, unchanged, against the SGLang-compatible
endpoint, with a local fake retrieval server on 127.0.0.1:8000 (the URL the example hard-codes).

Runs only when SLIME_CHECKOUT points at a slime checkout (its examples/search-r1 is put on
PYTHONPATH, beside slime itself; slime's rm_hub needs `pip install pylatexenc aiohttp`, or a
folder holding them in SLIME_EXTRA_PYTHONPATH). The engine is `search_engine.SearchScriptEngine`,
which searches first and answers once something was retrieved, so the samples are multi-turn:
model turn, retrieved `<information>` (loss mask 0), model turn. docs/serving.md records a run."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from aiohttp import web

from helpers import masked_spans
from pipeline.sinks.files import read_samples
from pipeline.sinks.jsonl import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = os.environ.get("SLIME_CHECKOUT")
DOC = '"Paris"\nParis is the capital and largest city of France.'
# Search-R1's instruction template (its answer extraction takes the last of at least two <answer>s)
TEMPLATE = ("Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
            "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
            "engine by <search> query </search> and it will return the top searched results between <information> "
            "and </information>. If you find no further external knowledge needed, you can directly provide the "
            "answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing "
            "</answer>. Question: {q}\n")

pytestmark = pytest.mark.skipif(not CHECKOUT, reason="set SLIME_CHECKOUT=<a slime checkout> to run search-r1")


@pytest.fixture
def retrieval_server():
    """A fake of Search-R1's retrieval server: POST /retrieve {queries, topk} -> {result: [[docs]]}."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 8000)) == 0:
            pytest.skip("127.0.0.1:8000 is taken; search-r1's local search posts there")
    queries: list = []
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    async def retrieve(request: web.Request) -> web.Response:
        body = await request.json()
        queries.append(body)
        return web.json_response({"result": [[{"contents": DOC}] * int(body.get("topk", 1))]})

    async def serve() -> web.AppRunner:
        app = web.Application()
        app.add_routes([web.post("/retrieve", retrieve)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 8000).start()
        return runner

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
    ready.set()
    yield queries
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_slimes_search_r1_runs_unchanged_with_retrieved_text_masked(retrieval_server, tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"input": TEMPLATE.format(q=f"what is the capital of France ({i})?"),
                                        "label": {"ground_truth": {"target": ["Paris"]}}}) + "\n" for i in range(4)))
    path = os.pathsep.join(filter(None, [CHECKOUT, os.path.join(CHECKOUT, "examples", "search-r1"),
                                         os.environ.get("SLIME_EXTRA_PYTHONPATH"), str(ROOT)]))
    env = dict(os.environ, PYTHONPATH=path, WANDB_MODE="offline", RAY_AUTH_MODE="disabled", HYDRA_FULL_ERROR="1")
    cmd = [sys.executable, "run.py", "engine=scripted", "engine._target_=tests.serving.search_engine.SearchScriptEngine",
           "+engine.hf_checkpoint=${hf_checkpoint}", "+engine.cache_dir=${paths.cache_dir}",
           f"data_source.prompt_data={data}", "rollout_batch_size=2", "n_samples_per_prompt=2", "num_rollout=1",
           "rollout_max_response_len=64", "logger=jsonl", "rollout.progress=false",
           "allowed_targets_extra=[tests.,generate_with_search.]",
           "rollout.custom_generate_path=generate_with_search.generate", "reward=custom",
           "reward.custom_rm_path=generate_with_search.reward_func", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-6000:]
    samples = read_samples(tmp_path / "run" / "samples" / "rollout_0.jsonl")
    assert len(samples) == 4 and len(retrieval_server) == 4  # one search per sample
    for s in samples:
        assert s.status == "completed" and s.reward == 1.0, (s.status, s.reward, s.response)
        assert "</search>" in s.response and "and more" not in s.response  # stopped at the stop string, kept it
        info = s.response.index("\n\n<information>")
        spans = masked_spans(s)
        assert len(spans) == 1, spans  # one retrieved span, masked out; both model turns trainable
        assert s.response.endswith("</answer>") and "Paris is the capital" in s.response[info:]
        assert len(s.rollout_log_probs) == s.response_length == len(s.loss_mask)
        assert all(s.rollout_log_probs[i] == 0.0 for i in range(spans[0][0], sum(spans[0])))
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")[0]
    assert metrics["rollout/http_requests"] == 8  # two model turns per sample, through the endpoint
    assert metrics["rollout/tokens_generated"] == sum(sum(s.loss_mask) for s in samples)
