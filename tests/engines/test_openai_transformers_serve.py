"""The openai engine against a real `transformers serve` process on loopback.

`transformers serve` takes text prompts only, samples only with `do_sample` (sent through its
`generation_config` field) and returns no log-probs; the engine's `transformers_serve` dialect
handles that. The server loads the converted bundled checkpoint folder, offline.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pipeline.engines.hf import HFEngine
from pipeline.engines.openai import OpenAIEngine
from tests.engines.conftest import request

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    exe = Path(sys.executable).with_name("transformers")
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
    proc = subprocess.Popen(
        [str(exe), "serve", model_path, "--host", "127.0.0.1", "--port", str(port),
         "--device", "cpu", "--dtype", "float32"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"transformers serve exited; see {log.name}"
            try:
                if httpx.get(url + "/health", timeout=1).is_success:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "transformers serve did not come up"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def engine(server: str, model_path: str) -> Iterator[OpenAIEngine]:
    eng = OpenAIEngine(server, dialect="transformers_serve", hf_checkpoint=model_path,
                       request_timeout_s=60)
    yield eng
    eng.close()


def test_greedy_matches_the_in_process_engine(engine: OpenAIEngine, hf_engine: HFEngine) -> None:
    tok = hf_engine.tokenizer
    local = asyncio.run(hf_engine.generate(request(tok, "l", temperature=0.0, max_new_tokens=8)))
    remote = asyncio.run(engine.generate(request(tok, "r", temperature=0.0, max_new_tokens=8)))
    assert asyncio.run(engine.health())
    assert remote.text == local.text
    assert remote.log_probs is None  # transformers serve returns none
    assert remote.output_ids == tok.encode(remote.text, add_special_tokens=False)
    assert remote.finish_reason in ("stop", "length")


def test_sampling_is_on_and_seeded(engine: OpenAIEngine, hf_engine: HFEngine) -> None:
    tok = hf_engine.tokenizer
    texts = [asyncio.run(engine.generate(request(tok, f"s{s}", "Name an animal.", temperature=1.0,
                                                  max_new_tokens=6, seed=s))).text
             for s in (1, 2, 3, 1)]
    assert len(set(texts[:3])) >= 2  # do_sample reached the server
    assert texts[3] == texts[0]  # the seed reached it too


def test_abort_returns_streamed_partial_text(engine: OpenAIEngine, hf_engine: HFEngine) -> None:
    tok = hf_engine.tokenizer

    async def go():  # type: ignore[no-untyped-def]
        task = asyncio.create_task(engine.generate(
            request(tok, "a", "Write a long story.", temperature=0.0, max_new_tokens=300)))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            await asyncio.sleep(0.25)
            inflight = list(engine._inflight)
            if inflight and time.monotonic() - t0 > 3:
                break
        await engine.abort_all()
        return await task

    res = asyncio.run(go())
    assert res.finish_reason == "abort"
    assert res.text and 0 < len(res.output_ids) < 300
