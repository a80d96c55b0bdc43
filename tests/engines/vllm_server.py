"""Start and stop a real vLLM OpenAI-compatible server (the opt-in vLLM tests' module fixtures).

`VLLM_PYTHON` (default `.venv-vllm/bin/python`, built by `scripts/vllm_venv.sh`) runs
`-m vllm.entrypoints.openai.api_server` on a free 127.0.0.1 port, float32, eager mode, with the
`--logprobs-mode processed_logprobs` the log-prob checks need; `serve` waits for `/health` and
stops the server when the block ends. `paused` stops a served server's processes for a block
(throughput comparisons: an idle vLLM worker polls for work).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

logger = logging.getLogger(__name__)

VLLM_PYTHON = Path(os.environ.get("VLLM_PYTHON", ".venv-vllm/bin/python"))
# Seconds to wait for the server's /health after start (model load + CPU warm-up on 2 cores).
STARTUP_TIMEOUT_S = 600.0


def selected(config: pytest.Config) -> bool:
    """The vLLM tests run only when asked for: `-m vllm` with the venv built, or VLLM_BASE_URL."""
    return os.environ.get("VLLM_BASE_URL") is not None or (
        str(config.getoption("markexpr", "")).strip() == "vllm" and VLLM_PYTHON.exists())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, n: int = 40) -> str:
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(lines[-n:])


# base URL -> pid of the servers `serve` runs (for `paused`)
_servers: dict[str, int] = {}


def _descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc: parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


@contextlib.contextmanager
def paused(url: str) -> Iterator[None]:
    """Stop the processes of the server `serve` runs at `url` (SIGSTOP) for the block, then let
    them go on (SIGCONT). An idle vLLM CPU worker polls for work (0.2 of a core measured here),
    which a throughput measurement of another engine on the same cores would pay for; paused,
    it uses none, as the in-process engine uses none while vLLM is measured. A server this
    module did not start (VLLM_BASE_URL) is left running."""
    pid = _servers.get(url)
    pids = _descendants(pid) if pid is not None else []
    stopped = []
    try:
        for p in pids:
            try:
                os.kill(p, signal.SIGSTOP)
                stopped.append(p)
            except ProcessLookupError:
                pass
        yield
    finally:
        for p in stopped:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass


@contextlib.contextmanager
def serve(model_path: str, log_path: Path, extra_args: list[str] | None = None,
          extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """A vLLM server on `model_path` (its log in `log_path`); yields its base URL."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           # KV cache size in GiB (the CPU backend's default is 4)
           "VLLM_CPU_KVCACHE_SPACE": "1", **(extra_env or {})}
    cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
           "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--dtype", "float32",
           "--max-model-len", "512", "--seed", "0", "--logprobs-mode", "processed_logprobs",
           *(extra_args or [])]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    _servers[url] = proc.pid
    started = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}; {log_path}:\n{_tail(log_path)}")
            try:
                if httpx.get(url + "/health", timeout=2).is_success:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > STARTUP_TIMEOUT_S:
                pytest.fail(f"vLLM not healthy after {STARTUP_TIMEOUT_S:.0f} s; {log_path}:\n{_tail(log_path)}")
            time.sleep(2)
        logger.info("vLLM healthy after %.1f s", time.monotonic() - started)
        yield url
    finally:
        _servers.pop(url, None)
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
