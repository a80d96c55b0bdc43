"""Fault injection: each fault either recovers (bounded, logged retries; nothing lost) or stops
with a clear error naming the URL / file / plugin after keeping what can be kept.

HTTP faults run the openai engine and the remote reward against `tests.engines.fake_server`;
pipeline faults run `pipeline.run.app.run` with `engine=scripted` on tiny sizes. A replica killed
mid-rollout is covered by `tests/engines/test_ray_engine.py::test_killed_replica_loses_nothing_and_is_restarted`
(real model + Ray), kill -9 of the whole run by `tests/resume/`.
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from pipeline.run.app import run
from pipeline.data.checkpoint import read_checkpoint
from pipeline.engines.base import GenerationRequest, SamplingParams
from pipeline.engines.openai import OpenAIEngine
from pipeline.rewards.remote import RemoteReward
from pipeline.samples.sample import Sample
from tests.engines.fake_server import FakeServer, serve
from tests.test_bad_inputs_pipeline import CONF, _overrides

ME = "tests.test_faults"


# ------------------------------------------------------------------------------- HTTP faults
def _ok(path: str, body: dict[str, Any]) -> tuple[int, Any]:
    n = body.get("max_tokens", 2)
    return 200, {"choices": [{"text": "x" * n, "finish_reason": "length", "logprobs": {
        "tokens": [f"token_id:{100 + i}" for i in range(n)], "token_logprobs": [-0.5] * n}}]}


def _fail_first(bad: tuple[int, Any], times: int = 2):
    calls = {"n": 0}

    def handler(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        calls["n"] += 1
        return bad if calls["n"] <= times else _ok(path, body)
    return handler


# fault -> a handler that fails twice, then answers
HTTP_FAULTS: dict[str, tuple[int, Any]] = {
    "500": (500, {"error": "boom"}),
    "503": (503, {"error": "busy"}),
    "malformed-json": (200, b'{"choices": [{"text": "x", '),
}


def _engine(url: str, **kw: Any) -> OpenAIEngine:
    return OpenAIEngine(url, model="m", dialect="vllm", stream=False, backoff_s=0.01, **kw)


def _gen(engine: OpenAIEngine, rid: str = "r0") -> Any:
    req = GenerationRequest(rid, input_ids=[5, 6], sampling=SamplingParams(max_new_tokens=2))
    return asyncio.run(engine.generate(req))


def _retry_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "retry" in r.getMessage()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fault", sorted(HTTP_FAULTS))
def test_engine_recovers_from_transient_fault(fault: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), serve(FakeServer(_fail_first(HTTP_FAULTS[fault]))) as fake:
        res = _gen(_engine(fake.url, max_retries=3))
    assert res.output_ids == [100, 101] and res.finish_reason == "length"
    assert len(fake.requests) == 3  # two failures, one success
    logs = _retry_logs(caplog)
    assert len(logs) == 2 and "retry 1/3" in logs[0] and "retry 2/3" in logs[1]
    assert fake.url in logs[0] and "r0" in logs[0]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("fault", sorted(HTTP_FAULTS))
def test_engine_gives_up_after_bounded_retries(fault: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), serve(FakeServer(_fail_first(HTTP_FAULTS[fault], 99))) as fake:
        with pytest.raises(Exception) as err:
            _gen(_engine(fake.url, max_retries=2))
    assert len(fake.requests) == 3  # 1 + max_retries, not more
    assert len(_retry_logs(caplog)) == 2
    text = str(err.value) + "".join(getattr(err.value, "__notes__", []))
    assert fake.url in text and "3 attempt" in text


@pytest.mark.timeout(30)
def test_engine_timeout_is_retried_then_recovers(caplog: pytest.LogCaptureFixture) -> None:
    slow = {"n": 0}

    def handler(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        slow["n"] += 1
        if slow["n"] == 1:
            time.sleep(1.0)  # longer than request_timeout_s
        return _ok(path, body)

    with caplog.at_level(logging.WARNING), serve(FakeServer(handler)) as fake:
        res = _gen(_engine(fake.url, max_retries=2, request_timeout_s=0.3))
    assert res.output_ids == [100, 101]
    logs = _retry_logs(caplog)
    assert len(logs) == 1 and "Timeout" in logs[0] and "retry 1/2" in logs[0]


@pytest.mark.timeout(30)
def test_engine_refused_connection_is_bounded_and_names_the_url(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    with caplog.at_level(logging.WARNING), pytest.raises(Exception) as err:
        _gen(_engine(url, max_retries=2))
    logs = _retry_logs(caplog)
    assert len(logs) == 2 and "ConnectError" in logs[0] and "retry 2/2" in logs[1]
    text = str(err.value) + "".join(getattr(err.value, "__notes__", []))
    assert url in text and "3 attempt" in text


def _sample(i: int) -> Sample:
    s = Sample(index=i, prompt="q", label="2")
    s.response = "2"
    return s


@pytest.mark.timeout(30)
def test_remote_reward_recovers_then_fails_clearly(caplog: pytest.LogCaptureFixture) -> None:
    calls = {"n": 0}

    def handler(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        calls["n"] += 1
        return (500, {}) if calls["n"] == 1 else (200, 1.0)

    with caplog.at_level(logging.WARNING), serve(FakeServer(handler)) as fake:
        rm = RemoteReward(fake.url + "/rm", max_retries=2, backoff_s=0.01)
        assert asyncio.run(rm(_sample(0))) == 1.0
    assert calls["n"] == 2 and "retry 1/2" in _retry_logs(caplog)[0]
    caplog.clear()
    url = f"http://127.0.0.1:{_free_port()}/rm"
    rm = RemoteReward(url, max_retries=1, backoff_s=0.01)
    with caplog.at_level(logging.WARNING), pytest.raises(Exception) as err:
        asyncio.run(rm(_sample(1)))
    assert len(_retry_logs(caplog)) == 1
    text = str(err.value) + "".join(getattr(err.value, "__notes__", []))
    assert url in text and "2 attempt" in text


# ------------------------------------------------------------------------------- pipeline faults
def _run(tmp: Path, *extra: str) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        run(compose(config_name="config", overrides=_overrides(tmp, *extra)))


def _steps(tmp: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]


def _resume_works(tmp: Path, *extra: str) -> None:
    """The last good checkpoint (rollout_0) is intact and a resume from it finishes the run."""
    ck = tmp / "run" / "checkpoints"
    assert read_checkpoint(ck / "rollout_0.json")["rollout_id"] == 0
    assert not (ck / "rollout_1.json").exists()
    _run(tmp, f"resume={tmp}/run", "num_rollout=2", *extra)
    assert read_checkpoint(ck / "rollout_1.json")["rollout_id"] == 1
    assert _steps(tmp)[-1] == 1


def _enospc_on(monkeypatch: pytest.MonkeyPatch, marker: str) -> None:
    """os.fsync raises ENOSPC while a file whose name contains `marker` is being written."""
    real_fsync, real_builtin_open = os.fsync, builtins.open
    writing: dict[int, str] = {}

    def fake_open(file: Any, *a: Any, **kw: Any) -> Any:
        fh = real_builtin_open(file, *a, **kw)
        if isinstance(file, (str, os.PathLike)) and marker in os.fspath(file):
            writing[fh.fileno()] = os.fspath(file)
        return fh

    def fake_fsync(fd: int) -> None:
        if fd in writing:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "fsync", fake_fsync)


@pytest.mark.timeout(90)
def test_disk_full_during_checkpoint_stops_clearly_and_keeps_the_previous(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(tmp_path)  # rollout 0, checkpoint rollout_0
    with monkeypatch.context() as m:
        _enospc_on(m, "rollout_1.json")
        with pytest.raises(OSError) as err:
            _run(tmp_path, f"resume={tmp_path}/run", "num_rollout=2")
    msg = str(err.value)
    assert "rollout_1.json" in msg and "No space left" in msg and "resume=" in msg
    assert not list((tmp_path / "run" / "checkpoints").glob(".*tmp"))  # no temp file left behind
    _resume_works(tmp_path)


@pytest.mark.timeout(90)
def test_read_only_train_data_dir_stops_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(tmp_path)
    real_replace = os.replace

    def read_only(src: Any, dst: Any) -> None:
        if "rollout_1" in os.fspath(dst) and "checkpoints" not in os.fspath(dst):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        real_replace(src, dst)

    with monkeypatch.context() as m:
        m.setattr(os, "replace", read_only)
        with pytest.raises(OSError) as err:
            _run(tmp_path, f"resume={tmp_path}/run", "num_rollout=2")
    msg = str(err.value)
    assert "Read-only file system" in msg and "rollout_1" in msg and "resume=" in msg
    _resume_works(tmp_path)


# plugins that raise on rollout 1 (rollout 0 was run with working defaults)
def rollout_boom(args, rollout_id, data_source, evaluation=False):
    raise RuntimeError("rollout plugin exploded")


def reward_boom(args, sample, **kwargs):
    raise RuntimeError("reward plugin exploded")


def filter_boom(args, samples, **kwargs):
    raise RuntimeError("filter plugin exploded")


PLUGIN_FAULTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # case -> (overrides of the first, good run; overrides that add the raising plugin)
    "rollout-function": ((), (f"rollout.path={ME}.rollout_boom",)),
    "reward-function": (("rollout=engine",), ("rollout=engine", "reward=custom",
                                              f"reward.custom_rm_path={ME}.reward_boom")),
    "dynamic-filter": (("rollout=engine",), ("rollout=engine", "dynamic_filter=nonzero_std",
                                             f"dynamic_filter.path={ME}.filter_boom")),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(PLUGIN_FAULTS))
def test_raising_plugin_stops_with_its_path_and_keeps_the_checkpoint(case: str, tmp_path: Path) -> None:
    good, bad = PLUGIN_FAULTS[case]
    _run(tmp_path, *good)
    with pytest.raises(Exception) as err:  # the plugin is a config change: opted in
        _run(tmp_path, f"resume={tmp_path}/run", "num_rollout=2", "allow_config_change=true", *bad)
    text = str(err.value) + "".join(getattr(err.value, "__notes__", []))
    assert "exploded" in text and f"{ME}." in text, text
    _resume_works(tmp_path, "allow_config_change=true", *good)  # and back
