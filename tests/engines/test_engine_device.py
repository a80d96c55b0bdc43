"""engine.device / engine.colocate (pipeline/engines/hf_device.py, hf.py, ray_pool.py) on a CPU-only
machine: the CUDA branches pinned by counting GPUs that are not there, and the decode path's
tensors made on the model's device (checked with torch's default device set to "meta": a tensor
made without `device=` lands there and the step fails)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir

from pipeline.cluster import devices
from pipeline.cluster.devices import DeviceError
from pipeline.config.args import ConfigError, validate
from pipeline.engines import hf as hf_module
from pipeline.engines import preflight, ray_pool
from pipeline.engines.base import SamplingParams
from pipeline.engines.hf import HFEngine
from pipeline.engines.hf_decode import DecodeBatch, Row, log_probs_alone
from pipeline.engines.hf_lean import LeanDecoder, native_problem
from pipeline.engines.hf_static import StaticDecodeBatch
from pipeline.engines.ray_pool import RayEngine, replica_options
from pipeline.process.precision import resolve_dtype

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
NAME = "smollm2-135m-instruct"


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set how many GPUs torch would count (devices.cuda_device_count)."""
    def set_count(n: int) -> None:
        monkeypatch.setattr(devices, "cuda_device_count", lambda: n)
    return set_count


# -- choosing the device ---------------------------------------------------------------------------

def test_auto_is_the_cpu_here_and_the_engine_is_unchanged(gpus: Any, caplog: pytest.LogCaptureFixture) -> None:
    gpus(0)
    caplog.set_level(logging.INFO, logger="pipeline.engines.hf_device")
    for engine in (HFEngine(NAME, device="auto", dtype="auto"), HFEngine(NAME, dtype="auto")):
        assert engine.device == "cpu" and engine.dtype == resolve_dtype("auto")
        assert engine.packed_matmuls is True and engine.native_kernels is True and engine.decode_impl == "static"
    assert caplog.records == []


def test_cuda_without_a_gpu_and_a_bad_value_are_refused_naming_the_key(gpus: Any) -> None:
    gpus(0)
    with pytest.raises(DeviceError, match="engine.device=cuda, but this machine has no CUDA device"):
        HFEngine(NAME, device="cuda")
    with pytest.raises(DeviceError, match=r"engine.device='gpu': expected one of \['auto', 'cpu', 'cuda'\]"):
        HFEngine(NAME, device="gpu")
    with pytest.raises(ValueError, match="engine.colocate must be true or false, got 'yes'"):
        HFEngine(NAME, colocate="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("count,choice,colocate,device", [
    (4, "cuda", False, "cuda:3"), (4, "cuda", True, "cuda:0"), (4, "auto", False, "cuda:3"),
    (1, "cuda", False, "cuda:0"), (1, "cuda", True, "cuda:0"), (2, "cpu", False, "cpu"),
])
def test_the_engine_takes_its_gpu_by_colocate(gpus: Any, count: int, choice: str, colocate: bool, device: str) -> None:
    gpus(count)
    assert HFEngine(NAME, device=choice, colocate=colocate).device == device


def test_on_cuda_auto_is_bfloat16_and_the_cpu_parts_switch_off_with_one_line_each(
        gpus: Any, caplog: pytest.LogCaptureFixture) -> None:
    gpus(2)
    caplog.set_level(logging.INFO, logger="pipeline.engines.hf_device")
    engine = HFEngine(NAME, device="cuda", dtype="auto")
    assert (engine.dtype, engine.packed_matmuls, engine.native_kernels) == ("bfloat16", False, False)
    assert engine.decode_impl == "static"  # the static path stays: its plain PyTorch step is device-agnostic
    assert [r.getMessage() for r in caplog.records] == [
        "hf engine: engine.packed_matmuls: off (cuda device; it tunes CPU compute only)",
        "hf engine: engine.native_kernels: off (cuda device; it tunes CPU compute only)"]
    caplog.clear()
    engine = HFEngine(NAME, device="cuda", dtype="float32", packed_matmuls=False)
    assert engine.dtype == "float32" and engine.native_kernels is False
    assert [r.getMessage() for r in caplog.records] == [
        "hf engine: engine.native_kernels: off (cuda device; it tunes CPU compute only)"]


def test_on_cuda_the_model_is_moved_to_the_engines_gpu_in_bfloat16(gpus: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    gpus(2)
    seen: dict[str, Any] = {}

    class FakeModel:
        def eval(self) -> FakeModel:
            return self

        def to(self, device: str) -> str:
            seen["to"] = device
            return "moved"

    def from_pretrained(path: str, **kw: Any) -> FakeModel:
        seen["dtype"] = kw["dtype"]
        return FakeModel()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    assert HFEngine(NAME, device="cuda", dtype="auto")._load_model("/m") == "moved"
    assert seen == {"dtype": torch.bfloat16, "to": "cuda:1"}
    seen.clear()
    cpu = HFEngine(NAME, dtype="float32")._load_model("/m")
    assert isinstance(cpu, FakeModel) and seen == {"dtype": torch.float32}  # the CPU: no move


def test_a_rows_generator_is_made_on_the_engines_device(gpus: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(2)
    made: list[str] = []

    class FakeGenerator:
        def __init__(self, device: str = "cpu") -> None:
            made.append(device)

        def manual_seed(self, seed: int) -> FakeGenerator:
            return self

    engine = HFEngine(NAME, device="cuda", colocate=True)
    engine._max_positions = 100
    monkeypatch.setattr(hf_module.torch, "Generator", FakeGenerator)
    from pipeline.engines.base import GenerationRequest

    engine._make_row(GenerationRequest("r", input_ids=[1, 2], sampling=SamplingParams(seed=3)), lambda row: None)
    assert made == ["cuda:0"]


def test_the_packed_and_native_paths_refuse_weights_off_the_cpu(model_path: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    # weights with no data: enough for the decoder's checks (from the config: from_pretrained with
    # device_map="meta" asks transformers >= 5.25's hub kernels for a meta device, which they refuse)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path), dtype=torch.float32)
    decoder = LeanDecoder(model, packed=True)  # float32: packed on the CPU wherever oneDNN is
    assert decoder.device.type == "meta" and not decoder.packed
    assert native_problem(decoder) == "they are CPU kernels and the model is on meta"


# -- every tensor of the decode path on the model's device ------------------------------------------

@pytest.fixture(scope="module")
def cpu_model(model_path: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    from pipeline.engines.assets import load_tokenizer

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval(), load_tokenizer(model_path)


def _rows(tok: Any, n: int, first: int, **sampling: Any) -> list[Row]:
    return [Row(request_id=f"r{first + i}", prompt_ids=tok.encode(f"Count to {first + i}, slowly.")[: 4 + i],
                sampling=SamplingParams(max_new_tokens=5, **sampling), max_new_tokens=5,
                generator=torch.Generator(device="cpu").manual_seed(first + i), stop_ids=frozenset(),
                on_done=lambda row: None) for i in range(n)]


def _generate(batch: Any, tok: Any, sampling: dict[str, Any]) -> list[list[int]]:
    """Two rows, then three joining with longer prompts, decoded until all finish."""
    rows = _rows(tok, 2, 0, **sampling) + _rows(tok, 3, 2, **sampling)
    batch.admit(rows[:2])
    batch.decode()
    batch.admit(rows[2:])
    while batch.rows:
        batch.release_finished()
        batch.decode()
    return [r.output_ids for r in rows]


@pytest.mark.parametrize("path", ["legacy", "static"])
@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.7},
                                      {"temperature": 1.0, "top_k": 5, "top_p": 0.9}], ids=["greedy", "t0.7", "cut"])
def test_the_decode_path_makes_every_tensor_on_the_models_device(cpu_model: tuple[Any, Any], path: str,
                                                                  sampling: dict[str, Any]) -> None:
    """With torch's default device "meta", any tensor the path makes without `device=` is a meta
    tensor and the step fails ("Cannot copy out of meta tensor"); made on the model's device, the
    path decodes the same tokens as without it."""
    model, tok = cpu_model

    def batch() -> Any:
        if path == "legacy":
            return DecodeBatch(model, tok, tok.pad_token_id)
        return StaticDecodeBatch(model, tok, tok.pad_token_id, LeanDecoder(model))

    with torch.inference_mode():
        expected = _generate(batch(), tok, sampling)
        with torch.device("meta"):
            got = _generate(batch(), tok, sampling)
            row = _rows(tok, 1, 0, **sampling)[0]
            row.output_ids = expected[0]
            alone = log_probs_alone(model, row)
    assert got == expected and len(alone) == len(expected[0])


# -- the ray engine --------------------------------------------------------------------------------

def test_replica_options_ask_for_one_gpu_on_cuda_only() -> None:
    assert replica_options(1.0, {}, "cuda") == {"num_cpus": 1.0, "max_restarts": 0, "max_concurrency": 1000,
                                                "num_gpus": 1}
    assert replica_options(2.0, {"node_a": 1}, "cpu") == {"num_cpus": 2.0, "max_restarts": 0,
                                                          "max_concurrency": 1000, "resources": {"node_a": 1}}
    with pytest.raises(ValueError, match=r"engine.device='gpu': expected one of \['auto', 'cpu', 'cuda'\]"):
        RayEngine(NAME, device="gpu")


class _FakeActorClass:
    """Stands in for `ray.remote(...)(_Replica)`: records each actor's options and arguments."""

    def __init__(self) -> None:
        self.spawned: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def options(self, **options: Any) -> Any:
        parent = self

        class _Bound:
            def remote(self, kwargs: dict[str, Any], *rest: Any) -> Any:
                parent.spawned.append((options, kwargs))
                health = type("H", (), {"remote": staticmethod(lambda: asyncio.sleep(0))})
                return type("A", (), {"health": health})()
        return _Bound()


@pytest.mark.parametrize("choice,cluster_gpus,device", [("auto", 2, "cuda"), ("cuda", 1, "cuda"), ("auto", 0, "cpu"),
                                                        ("cpu", 2, "cpu")])
def test_ray_replicas_get_a_gpu_each_and_build_their_engine_on_cuda(
        monkeypatch: pytest.MonkeyPatch, choice: str, cluster_gpus: int, device: str) -> None:
    ray = pytest.importorskip("ray")
    fake = _FakeActorClass()
    released: list[Any] = []
    monkeypatch.setattr(ray_pool, "resolve_checkpoint", lambda name, cache: "/ckpt")
    monkeypatch.setattr(ray_pool.ray_runtime, "acquire", lambda *a, **k: "lease")
    monkeypatch.setattr(ray_pool.ray_runtime, "release", released.append)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0, **({"GPU": float(cluster_gpus)} if cluster_gpus else {})})
    monkeypatch.setattr(ray, "remote", lambda **kw: (lambda cls: fake))
    engine = RayEngine(NAME, num_replicas=2, device=choice)
    asyncio.run(engine.start())
    assert len(fake.spawned) == 2
    for options, kwargs in fake.spawned:
        assert kwargs["device"] == device
        assert options.get("num_gpus") == (1 if device == "cuda" else None)
    engine._slots = []  # nothing real to kill
    engine.close()
    assert released == ["lease"]


def test_ray_cuda_on_a_cluster_without_gpus_is_refused_and_lets_ray_go(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    released: list[Any] = []
    monkeypatch.setattr(ray_pool, "resolve_checkpoint", lambda name, cache: "/ckpt")
    monkeypatch.setattr(ray_pool.ray_runtime, "acquire", lambda *a, **k: "lease")
    monkeypatch.setattr(ray_pool.ray_runtime, "release", released.append)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(DeviceError, match=r"engine.device=cuda, but the Ray cluster \(a local Ray\) has no GPU"):
        asyncio.run(RayEngine(NAME, device="cuda").start())
    assert released == ["lease"]


# -- pre-flight -------------------------------------------------------------------------------------

def _compose(tmp: Path, *overrides: str) -> Any:
    base = [f"paths.output_dir={tmp}/out", f"paths.cache_dir={tmp}/cache", "data_source.apply_chat_template=false"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=base + list(overrides))


@pytest.mark.parametrize("overrides,message", [
    (["engine.device=gpu"], r"engine.device: expected one of \['auto', 'cpu', 'cuda'\] \(auto: CUDA when there is "
                            r"a GPU\), got 'gpu'"),
    (["engine.device=cuda"], r"engine.device=cuda, but this machine has no CUDA device torch can use .*use "
                             r"engine.device=cpu or engine.device=auto"),
    (["engine=ray", "engine.device=cuda"], "engine.device=cuda, but this machine has no CUDA device"),
    (["engine=ray", "engine.device=1"], r"engine.device: expected one of .*, got 1"),
    (["engine.colocate=maybe"], "engine.colocate: expected true or false .*got 'maybe'"),
    (["engine.device=auto"], None), (["engine.device=cpu", "engine.colocate=true"], None),
    # a cluster's GPUs are Ray's to count when the engine starts, not this machine's
    (["engine=ray", "engine.device=cuda", "engine.address=auto"], None),
])
def test_pre_flight_refuses_bad_device_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                overrides: list[str], message: str | None) -> None:
    monkeypatch.setattr(preflight, "visible_gpus", lambda: 0)
    cfg = _compose(tmp_path, *overrides)
    if message is None:
        validate(cfg)
        return
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_pre_flight_passes_cuda_where_a_gpu_is_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "visible_gpus", lambda: 1)
    validate(_compose(tmp_path, "engine.device=cuda"))


def test_run_py_refuses_engine_device_cuda_without_a_gpu_before_anything_starts(tmp_path: Path) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HYDRA_FULL_ERROR="1")
    proc = subprocess.run([sys.executable, "run.py", "engine.device=cuda", "engine.colocate=2",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "engine.device=cuda, but this machine has no CUDA device torch can use (CUDA_VISIBLE_DEVICES='')" in proc.stderr
    assert "engine.colocate: expected true or false" in proc.stderr and "got 2" in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
