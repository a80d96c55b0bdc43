"""engine=sglang: a slime-style HTTP generate posts to the engine's own server (a fake SGLang
server here), from args set from its base_url; and where slime is importable, plugins get slime's
own Sample class (pipeline/slime/stand_ins.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from aiohttp import web

from helpers import compose_run, masked_spans, samples_of
from pipeline.run.app import run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_sglang():
    """An aiohttp fake of SGLang's /generate: a tool turn ending in '.' first, then a final turn."""
    seen: list = []
    loop = asyncio.new_event_loop()

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        first = "<information>" not in body.get("text", "")
        ids = [101, 102, 103] if first else [104, 105]
        text = "look it up." if first else "done"
        return web.json_response({"text": text, "output_ids": ids, "meta_info": {
            "id": body.get("rid"), "weight_version": "7", "prompt_tokens": 5, "completion_tokens": len(ids),
            "cached_tokens": 2, "finish_reason": {"type": "stop", "matched": "."} if first else {"type": "length"},
            "output_token_logprobs": [[-0.25, t, None] for t in ids]}})

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    async def serve() -> tuple[web.AppRunner, int]:
        app = web.Application()
        app.add_routes([web.post("/generate", generate), web.get("/health", ok), web.post("/abort_request", ok)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]

    threading.Thread(target=loop.run_forever, daemon=True).start()
    runner, port = asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
    yield port, seen
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)


@pytest.mark.timeout(120)
def test_engine_sglang_sets_the_router_args_from_base_url_and_starts_no_server(fake_sglang, tmp_path):
    port, seen = fake_sglang
    metrics = run(compose_run(tmp_path, f"engine.base_url=http://127.0.0.1:{port}", engine="sglang"))
    samples = samples_of(tmp_path)
    assert len(seen) == 2 * len(samples) == 8  # every turn reached the engine's own server
    assert all(b["return_logprob"] and "." in b["sampling_params"]["stop"] for b in seen)
    # each second turn carries a first turn and the observation (the samples' requests interleave
    # in whatever order they arrive, so not seen[0] then seen[1])
    firsts = [b["text"] for b in seen if "<information>" not in b["text"]]
    seconds = [b["text"] for b in seen if "<information>" in b["text"]]
    assert len(firsts) == len(seconds) == len(samples)
    assert all(any(t.startswith(f) and len(t) > len(f) for f in firsts) for t in seconds)
    for s in samples:
        assert s.tokens[-s.response_length:][:3] == [101, 102, 103]
        assert len(masked_spans(s)) == 1 and s.weight_versions == ["7", "7"]
        assert s.prefix_cache_info.cached_tokens == 4 and s.status == "truncated"
    assert metrics["rollout/http_requests"] == 0  # nothing went through an endpoint of ours


FAKE_SLIME_TYPES = '''
from dataclasses import dataclass, field
from enum import Enum


@dataclass
class Sample:
    """A stand-in for slime's own Sample class: not the pipeline's."""
    group_index: int | None = None
    index: int | None = None
    prompt: str = ""
    tokens: list = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: object = None
    reward: object = None
    loss_mask: list | None = None
    rollout_log_probs: list | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
'''

PLUGIN = '''
from slime.utils.types import Sample


async def generate(args, sample, sampling_params):
    if not isinstance(sample, Sample):
        raise TypeError(f"expected slime's Sample, got {type(sample)}")
    sample.tokens = sample.tokens + [1, 2, 3]
    sample.response, sample.response_length = "abc", 3
    sample.loss_mask, sample.rollout_log_probs = [1, 0, 1], [-0.1, 0.0, -0.3]
    sample.status = Sample.Status.COMPLETED
    sample.metadata["seen_class"] = type(sample).__module__
    sample.extra_note = "kept"
    return sample


async def reward(args, sample):
    if not isinstance(sample, Sample):
        raise TypeError("Sample must be an instance of Sample class.")
    sample.metadata["rewarded_as"] = type(sample).__module__
    return 1.0
'''


@pytest.mark.timeout(120)
def test_where_slime_is_importable_plugins_get_slimes_own_sample_class(tmp_path):
    (tmp_path / "slime" / "utils").mkdir(parents=True)
    (tmp_path / "slime" / "__init__.py").write_text("")
    (tmp_path / "slime" / "utils" / "__init__.py").write_text("")
    (tmp_path / "slime" / "utils" / "types.py").write_text(textwrap.dedent(FAKE_SLIME_TYPES))
    (tmp_path / "slime_checks.py").write_text(textwrap.dedent(PLUGIN))
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": f"What is {i} + 1?", "label": str(i + 1)}) + "\n" for i in range(4)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), WANDB_MODE="offline")
    cmd = [sys.executable, "run.py", "engine=scripted", f"data_source.prompt_data={data}", "rollout_batch_size=2",
           "n_samples_per_prompt=1", "num_rollout=1", "logger=jsonl", "rollout.progress=false",
           "allowed_targets_extra=[slime_checks.]", "rollout.custom_generate_path=slime_checks.generate",
           "reward=custom", "reward.custom_rm_path=slime_checks.reward", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-5000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples" / "rollout_0.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["metadata"]["seen_class"] == row["metadata"]["rewarded_as"] == "slime.utils.types"
        assert row["status"] == "completed" and row["reward"] == 1.0 and row["loss_mask"] == [1, 0, 1]
        assert row["response"] == "abc" and row["tokens"][-3:] == [1, 2, 3] and row["extra_note"] == "kept"
