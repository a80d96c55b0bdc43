"""Fixtures for rollout tests: a tiny arithmetic prompt file, the scripted engine, slime-style args."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.data.sources import BufferedDataSource, PlainDataSource
from pipeline.engines.scripted import ByteTokenizer, ScriptedEngine
from pipeline.rollout.engine_rollout import EngineRollout
from rollout_helpers import BoxedReward, write_prompts


@pytest.fixture
def prompt_file(tmp_path: Path) -> Path:
    return write_prompts(tmp_path / "prompts.jsonl", 64)


@pytest.fixture
def make_source(prompt_file: Path):
    def _make(n: int = 2, buffered: bool = True, **kw: Any):
        cls = BufferedDataSource if buffered else PlainDataSource
        return cls(prompt_data=str(prompt_file), n_samples_per_prompt=n, shuffle=False, **{"label_key": "label", "apply_chat_template": False, **kw})
    return _make


@pytest.fixture
def tokenizer() -> ByteTokenizer:
    return ByteTokenizer()


@pytest.fixture
def make_rollout(tokenizer: ByteTokenizer):
    def _make(engine: ScriptedEngine | None = None, **kw: Any) -> EngineRollout:
        kw.setdefault("progress", False)
        return EngineRollout(engine=engine or ScriptedEngine(), reward=kw.pop("reward", BoxedReward()),
                             tokenizer=kw.pop("tokenizer", tokenizer), **kw)
    return _make
