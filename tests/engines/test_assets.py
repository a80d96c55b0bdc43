"""resolve_checkpoint: bundled conversion, pass-through, errors, single conversion under a lock."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from pipeline.engines import assets
from pipeline.engines.assets import CheckpointError, resolve_checkpoint


def test_local_folder_passes_through(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert resolve_checkpoint(str(tmp_path), tmp_path / "cache") == str(tmp_path.resolve())


def test_folder_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no config.json"):
        resolve_checkpoint(str(tmp_path), tmp_path / "cache")


def test_unknown_name_is_refused_without_download(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="neither a bundled model"):
        resolve_checkpoint("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path)


def test_conversion_runs_once_across_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def fake_convert(name: str, target: Path) -> None:
        calls.append(target)
        time.sleep(0.2)  # both threads are inside resolve_checkpoint by now
        target.mkdir(parents=True)
        (target / assets._DONE_MARKER).write_text("x")

    monkeypatch.setattr(assets, "_convert", fake_convert)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(
        resolve_checkpoint("smollm2-135m-instruct", tmp_path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == [str(tmp_path / "models" / "smollm2-135m-instruct")] * 2


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bundled_model_is_a_loadable_hf_folder(model_path: str) -> None:
    from transformers import AutoConfig

    from pipeline.engines.assets import load_tokenizer

    path = Path(model_path)
    assert (path / "model.safetensors").is_file()
    config = AutoConfig.from_pretrained(path)
    assert "quantization_config" not in config.to_dict()
    tok = load_tokenizer(path)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert "<|im_start|>assistant" in text
    # reused: a second resolve returns the same folder at once
    t0 = time.perf_counter()
    assert resolve_checkpoint("smollm2-135m-instruct", path.parent.parent) == str(path)
    assert time.perf_counter() - t0 < 1.0
