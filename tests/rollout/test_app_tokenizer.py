"""The app loads the checkpoint's tokenizer once (not the model) and shares it between the data
source and the rollout."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.loop.parts import build_parts
from pipeline.config.args import SlimeArgs, to_plain, validate
from pipeline.config.plugins import allowed_targets
from pipeline.engines.assets import default_cache_dir, resolve_checkpoint

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ["hf", "ray"])
def test_one_tokenizer_load_shared_by_data_source_and_rollout(engine, tmp_path, monkeypatch):
    import transformers

    cache = default_cache_dir()
    resolve_checkpoint("smollm2-135m-instruct", cache)  # converted once for the whole test suite
    loads = []
    real = transformers.AutoTokenizer.from_pretrained

    def counting(*a, **kw):
        loads.append(a[0] if a else kw)
        return real(*a, **kw)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", counting)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            f"engine={engine}", "logger=jsonl", f"paths.output_dir={tmp_path}/out",
            f"paths.cache_dir={cache}", "data_source=buffered", "data_source.apply_chat_template=true"])
    validate(cfg)
    plain = to_plain(cfg)
    closers: list = []
    try:
        parts, _, _ = build_parts(plain, SlimeArgs.from_config(plain), allowed_targets(plain),
                             str(tmp_path / "out"), closers)
        rollout = parts.rollout_fn
        assert len(loads) == 1, loads
        assert rollout.tokenizer is not None
        assert rollout.tokenizer is parts.data_source.dataset.tokenizer.obj
        assert getattr(rollout.engine, "model", None) is None  # only the tokenizer was loaded
        assert getattr(rollout.engine, "_started", False) is False  # no Ray replicas started
    finally:
        for c in closers:
            getattr(c, "close", lambda: None)()
