"""Security: no unsafe deserialisation in `pipeline/`, the `_target_` allowlist, no remote code,
remote URLs only from config, and no secrets in logs or dumped configs (docs/reliability.md, "Security")."""

from __future__ import annotations

import ast
import asyncio
import http.server
import inspect
import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from pipeline.config.args import ConfigError, validate
from pipeline.config.plugins import TargetNotAllowedError, build, load_object
from pipeline.samples.sample import Sample
from pipeline.sinks.redact import REDACTED, is_secret_key, redact, redact_hydra_dir, redact_text

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
DEFAULT_ALLOWED = ("pipeline.", "builtins.dict", "builtins.list", "functools.partial")


# ------------------------------------------------------------------------ source scan
_UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def unsafe_calls(source: str, filename: str = "<src>") -> list[str]:
    """Every unsafe load / code-execution construct in `source`, as `file:line: what`."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name.split(".")[0] in _UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _UNSAFE_MODULES:
            found.append(f"{where}: from {node.module} import")
        elif isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id in ("eval", "exec", "__import__", "compile"):
                found.append(f"{where}: {fn.id}()")
            elif isinstance(fn, ast.Attribute):
                owner = fn.value.id if isinstance(fn.value, ast.Name) else ""
                if owner in _UNSAFE_MODULES:
                    found.append(f"{where}: {owner}.{fn.attr}()")
                elif owner == "torch" and fn.attr == "load" and not _is_true(_kw(node, "weights_only")):
                    found.append(f"{where}: torch.load without weights_only=True")
                elif owner == "yaml" and fn.attr in ("load", "load_all", "unsafe_load", "full_load"):
                    loader = _kw(node, "Loader")
                    if fn.attr in ("unsafe_load", "full_load") or not (
                            isinstance(loader, ast.Attribute) and loader.attr in ("SafeLoader", "CSafeLoader")):
                        found.append(f"{where}: yaml.{fn.attr} without SafeLoader")
                elif fn.attr in ("load", "read_pickle") and _is_true(_kw(node, "allow_pickle")):
                    found.append(f"{where}: {fn.attr}(allow_pickle=True)")
                elif fn.attr == "read_pickle" or (owner == "os" and fn.attr in ("system", "popen")):
                    found.append(f"{where}: {owner}.{fn.attr}()")
                elif fn.attr == "from_pretrained" and _is_true(_kw(node, "trust_remote_code")):
                    found.append(f"{where}: from_pretrained(trust_remote_code=True)")
                if _is_true(_kw(node, "shell")):
                    found.append(f"{where}: shell=True")
    return found


def test_the_scanner_finds_every_unsafe_pattern():
    bad = """
import pickle
from dill import loads
import yaml, torch, numpy as np, os
pickle.loads(b"")
torch.load("x")
torch.load("x", weights_only=False)
yaml.load(s)
yaml.load(s, Loader=yaml.Loader)
yaml.unsafe_load(s)
np.load("x", allow_pickle=True)
eval("1")
exec("1")
os.system("ls")
AutoModel.from_pretrained("x", trust_remote_code=True)
subprocess.run("ls", shell=True)
"""
    flagged = {int(hit.split(":")[1]) for hit in unsafe_calls(bad)}
    assert flagged == set(range(2, 17)) - {4}, unsafe_calls(bad)  # every line but the plain imports
    good = """
import yaml, torch, numpy as np
torch.load("x", weights_only=True)
yaml.load(s, Loader=yaml.SafeLoader)
yaml.safe_load(s)
np.load("x", allow_pickle=False)
model.eval()
AutoModel.from_pretrained("x", trust_remote_code=self.trust_remote_code)
"""
    assert unsafe_calls(good) == []


def test_pipeline_source_has_no_unsafe_load_or_exec():
    files = sorted((ROOT / "pipeline").rglob("*.py")) + [ROOT / "run.py"]
    assert len(files) > 40
    found = [hit for f in files for hit in unsafe_calls(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))]
    assert found == []


class _Boom:
    """Unpickling this runs `touch <path>`: proof that nothing unpickles it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


@pytest.mark.timeout(30)
def test_pickle_payloads_are_refused_on_every_load_path(tmp_path):
    from pipeline import PlainDataSource
    from pipeline.data.errors import CheckpointError
    from pipeline.sinks.files import load_train_data, read_samples

    sentinel = tmp_path / "pwned"
    payload = pickle.dumps(_Boom(sentinel))
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "a"}\n')
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "rollout_0.json").write_bytes(payload)
    with pytest.raises(CheckpointError, match="rollout_0.json"):
        PlainDataSource(prompt_data=str(data), n_samples_per_prompt=1, save_dir=tmp_path / "ck", label_key=None, apply_chat_template=False).load(0)
    (tmp_path / "dump.jsonl").write_bytes(payload)
    with pytest.raises(Exception):
        read_samples(tmp_path / "dump.jsonl")
    for name in ("td.json", "td.safetensors"):
        (tmp_path / name).write_bytes(payload)
    with pytest.raises(Exception):
        load_train_data(tmp_path / "td")
    assert not sentinel.exists()


# ------------------------------------------------------------------------ allowlist
@pytest.mark.timeout(30)
@pytest.mark.parametrize("node", [
    {"_target_": "os.system", "_args_": ["touch {s}"]},
    {"_target_": "posix.system", "_args_": ["touch {s}"]},
    {"_target_": "subprocess.Popen", "_args_": [["touch", "{s}"]]},
    {"_target_": "subprocess.run", "_args_": [["touch", "{s}"]]},
    {"_target_": "builtins.eval", "_args_": ["__import__('os').system('touch {s}')"]},
    {"_target_": "builtins.exec", "_args_": ["import os; os.system('touch {s}')"]},
    {"_target_": "builtins.__import__", "_args_": ["os"]},
    # an allowed-looking path through a module attribute: pipeline.run.app imports os
    {"_target_": "pipeline.run.app.os.system", "_args_": ["touch {s}"]},
    {"_target_": "pipeline.config.plugins.importlib.import_module", "_args_": ["os"]},
    # nested, in a keyword and in _args_
    {"_target_": "builtins.dict", "x": {"_target_": "os.system", "_args_": ["touch {s}"]}},
    {"_target_": "builtins.list", "_args_": [[{"_target_": "posix.system", "_args_": ["touch {s}"]}]]},
    # via path: (a function reference)
    {"path": "os.system"},
    {"path": "pipeline.run.app.os.system"},
], ids=lambda n: json.dumps(n)[:60])
def test_allowlist_refuses_code_execution_targets(node, tmp_path):
    sentinel = tmp_path / "pwned"
    node = json.loads(json.dumps(node).replace("{s}", str(sentinel)))
    with pytest.raises(TargetNotAllowedError, match="is not allowed"):
        build(node, allowed=DEFAULT_ALLOWED, where="rollout")
    with pytest.raises(TargetNotAllowedError):
        build(node, where="rollout")  # allowed=None: only pipeline.
    assert not sentinel.exists()


def test_allowlist_is_on_by_default_and_still_builds_pipeline_parts():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config")
    assert list(cfg.allowed_targets) == list(DEFAULT_ALLOWED) and list(cfg.allowed_targets_extra) == []
    assert build({"_target_": "builtins.dict", "a": 1}, allowed=DEFAULT_ALLOWED) == {"a": 1}
    assert callable(build({"path": "pipeline.data.buffer_filters.pop_first"}, allowed=DEFAULT_ALLOWED, where="filter"))
    with pytest.raises(TargetNotAllowedError, match="'posix.system'"):
        load_object("pipeline.run.app.os.system", DEFAULT_ALLOWED, "x")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("override", [
    "rollout.path=subprocess.Popen", "custom_reward_post_process_path=os.system",
    "reward.custom_rm_path=builtins.eval", "engine._target_=posix.system", "+logger.x._target_=os.system",
])
def test_validate_refuses_disallowed_targets_before_anything_is_imported(override, tmp_path):
    extra = ["rollout=function"] if override.startswith("rollout.") else []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"paths.output_dir={tmp_path}", *extra, override])
    with pytest.raises(ConfigError, match="is not allowed") as err:
        validate(cfg)
    key = override.lstrip("+").split("=")[0]
    assert key in str(err.value)


@pytest.mark.timeout(30)
def test_reward_function_named_by_a_sample_goes_through_the_allowlist(tmp_path):
    from pipeline.config.args import SlimeArgs
    from pipeline.rewards.dispatch import RewardDispatcher

    sample = Sample(index=0, prompt="p", response=f"touch {tmp_path}/pwned", label="1")
    sample.custom_rm_path = "os.system"
    args = SlimeArgs({"allowed_targets": list(DEFAULT_ALLOWED), "allowed_targets_extra": [], "rm_type": "math"})
    with pytest.raises(TargetNotAllowedError, match="custom_rm_path"):
        asyncio.run(RewardDispatcher().score(args, [sample]))
    assert not (tmp_path / "pwned").exists()


# ------------------------------------------------------------------------ remote code
def test_models_load_without_trust_remote_code_by_default(monkeypatch):
    from pipeline.engines import assets, hf

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["engine=hf"])
    assert cfg.engine.trust_remote_code is False
    assert inspect.signature(hf.HFEngine).parameters["trust_remote_code"].default is False
    assert inspect.signature(assets.load_tokenizer).parameters["trust_remote_code"].default is False


class _Stop(Exception):
    pass


@pytest.mark.parametrize("flag", [False, True])
def test_trust_remote_code_is_passed_through_from_the_config(flag, monkeypatch, tmp_path):
    import transformers

    from pipeline.engines import hf

    seen: dict[str, Any] = {}

    def fake_tokenizer(path, trust_remote_code=False):
        seen["tokenizer"] = trust_remote_code
        return object()

    def fake_model(path, **kwargs):
        seen["model"] = kwargs.get("trust_remote_code")
        raise _Stop

    monkeypatch.setattr(hf, "resolve_checkpoint", lambda name, cache: str(tmp_path))
    monkeypatch.setattr(hf, "load_tokenizer", fake_tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    engine = build({"_target_": "pipeline.engines.hf.HFEngine", "hf_checkpoint": str(tmp_path),
                    "cache_dir": str(tmp_path), "trust_remote_code": flag}, allowed=DEFAULT_ALLOWED)
    with pytest.raises(_Stop):
        engine.start()
    assert seen == {"tokenizer": flag, "model": flag}


# ------------------------------------------------------------------------ URLs from config
class _Recorder(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.server.hits += 1  # type: ignore[attr-defined]
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b"1.0"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _server() -> tuple[http.server.ThreadingHTTPServer, str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    srv.hits = 0  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/reward"


@pytest.mark.timeout(30)
def test_remote_reward_url_comes_only_from_config():
    from pipeline.config.args import SlimeArgs
    from pipeline.rewards.dispatch import RewardDispatcher

    configured, configured_url = _server()
    evil, evil_url = _server()
    try:
        sample = Sample(index=0, prompt="p", response="r", label="1", metadata={
            "rm_type": "remote", "rm_url": evil_url, "remote_url": evil_url, "url": evil_url,
            "base_url": evil_url})
        args = SlimeArgs({"allowed_targets": list(DEFAULT_ALLOWED), "allowed_targets_extra": [], "rm_type": "math"})
        dispatcher = RewardDispatcher(rm_type="math", remote_url=configured_url, remote_max_retries=0)
        try:
            assert asyncio.run(dispatcher.score(args, [sample])) == [1.0]
        finally:
            dispatcher.close()
        assert (configured.hits, evil.hits) == (1, 0)
    finally:
        configured.shutdown()
        evil.shutdown()


def test_engine_requests_carry_no_url():
    import dataclasses

    from pipeline.engines.base import GenerationRequest

    names = [f.name for f in dataclasses.fields(GenerationRequest)]
    assert not [n for n in names if any(w in n.lower() for w in ("url", "host", "endpoint", "port"))]


# ------------------------------------------------------------------------ secrets
def test_redact_hides_secret_keys_only():
    cfg = {"engine": {"api_key": "sk-1", "base_url": "http://u:pw@host:1/v1", "max_tokens": 5,
                      "headers": {"Authorization": "Bearer t0k"}, "extra_body": {"client_secret": "s"}},
           "hf_token": "hf_x", "db": {"password": "p", "passwd": "p2"}, "wandb_api_key": "w",
           "rollout_stop_token_ids": [1], "tokenizer": "tok", "env_key": "${oc.env:OPENAI_API_KEY,null}",
           "api_key": "${oc.env:OPENAI_API_KEY,null}", "token": None, "list": [{"apikey": "a"}],
           "secrets": {"_target_": "x.Y", "password": "p3"}}
    out = redact(cfg)
    assert out["engine"]["api_key"] == out["engine"]["headers"]["Authorization"] == REDACTED
    assert out["engine"]["extra_body"]["client_secret"] == out["hf_token"] == out["wandb_api_key"] == REDACTED
    assert out["db"] == {"password": REDACTED, "passwd": REDACTED} and out["list"] == [{"apikey": REDACTED}]
    assert out["engine"]["base_url"] == f"http://u:{REDACTED}@host:1/v1"
    assert out["engine"]["max_tokens"] == 5 and out["rollout_stop_token_ids"] == [1] and out["tokenizer"] == "tok"
    assert out["api_key"] == "${oc.env:OPENAI_API_KEY,null}" and out["token"] is None
    assert out["secrets"] == {"_target_": "x.Y", "password": REDACTED}  # a node is walked, not dropped
    assert cfg["engine"]["api_key"] == "sk-1"  # a copy
    assert redact_text("engine.api_key=sk-1,num_rollout=2,+x.auth_token=abc def") == \
        f"engine.api_key={REDACTED},num_rollout=2,+x.auth_token={REDACTED}"
    assert not is_secret_key("max_new_tokens") and is_secret_key("WANDB_API_KEY")


def test_redact_hydra_dir_rewrites_config_and_overrides(tmp_path):
    (tmp_path / "config.yaml").write_text("engine:\n  api_key: sk-SECRET\n  model: m\n")
    (tmp_path / "overrides.yaml").write_text("- engine.api_key=sk-SECRET\n- num_rollout=2\n")
    changed = redact_hydra_dir(tmp_path)
    assert sorted(p.name for p in changed) == ["config.yaml", "overrides.yaml"]
    text = (tmp_path / "config.yaml").read_text() + (tmp_path / "overrides.yaml").read_text()
    assert "sk-SECRET" not in text and "model: m" in text and "num_rollout=2" in text


def test_wandb_sink_redacts_config_and_name(monkeypatch, tmp_path):
    import wandb

    from pipeline.sinks.wandb import WandbSink

    seen: dict[str, Any] = {}

    class Run:
        id = "abc"

    def fake_init(**kwargs: Any) -> Run:
        seen.update(kwargs)
        return Run()

    monkeypatch.setattr(wandb, "init", fake_init)
    WandbSink(project="p").start(run_dir=str(tmp_path), name="engine.api_key=sk-SECRET,num_rollout=2", group=None,
                                 config={"engine": {"api_key": "sk-SECRET", "headers": {"authorization": "b"}}})
    assert "sk-SECRET" not in json.dumps(seen["config"]) + seen["name"]
    assert seen["config"]["engine"]["headers"]["authorization"] == REDACTED


@pytest.mark.slow  # a CLI subprocess with wandb: kept out of the fast runs (and the mutation run)
@pytest.mark.timeout(120)
def test_cli_run_leaves_no_secret_in_any_file(tmp_path):
    """A CLI run with an API key, an auth header and a token on the command line, wandb offline:
    no file in the run dir (run.log, .hydra/*.yaml, wandb files, metrics, dumps) holds them."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input": f"What is {i} + 1?", "label": str(i + 1)}) + "\n" for i in range(4)))
    secrets = ["sk-SECRETKEY123", "Bearer-SECRETHEADER456", "hf_SECRETTOKEN789"]
    run_dir = tmp_path / "run"
    # a function rollout does not build the engine: the openai engine's keys are only config here
    cmd = [sys.executable, "run.py", "engine=openai", "logger=wandb", "num_rollout=1", "rollout_batch_size=2",
           "n_samples_per_prompt=2", "data_source.apply_chat_template=false", f"data_source.prompt_data={data}",
           "rollout=function", "rollout.path=tests.test_bad_inputs_pipeline.good_rollout",
           "allowed_targets_extra=[tests.]", f"hydra.run.dir={run_dir}", f"engine.api_key={secrets[0]}",
           f"+engine.extra_body.Authorization={secrets[1]}", f"+hf_token={secrets[2]}"]
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in files) and any("wandb" in p.parts for p in files)
    leaks = [(str(p.relative_to(run_dir)), s) for p in files for s in secrets if s.encode() in p.read_bytes()]
    assert leaks == []
    assert not [s for s in secrets if s in proc.stdout + proc.stderr]
    hydra_dir = run_dir / ".hydra"
    assert f"engine.api_key={REDACTED}" in (hydra_dir / "overrides.yaml").read_text()
    assert "pipeline.sinks.redact.RedactHydraFiles" in (hydra_dir / "hydra.yaml").read_text()  # nothing else lost
    assert "base_url: http://127.0.0.1:8000" in (hydra_dir / "config.yaml").read_text()
