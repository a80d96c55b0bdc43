"""Shared fixtures for engine tests: one real hf engine per session (model loads once)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.engines.assets import default_cache_dir, resolve_checkpoint
from pipeline.engines.base import GenerationRequest, SamplingParams
from pipeline.engines.hf import HFEngine


@pytest.fixture(scope="session")
def model_path() -> str:
    """The converted bundled model (converted once into the shared repo cache)."""
    return resolve_checkpoint("smollm2-135m-instruct", default_cache_dir())


@pytest.fixture(scope="session")
def hf_engine(model_path: str) -> Iterator[HFEngine]:
    """A started hf engine on 2 threads."""
    engine = HFEngine(model_path, num_threads=2, max_batch_size=8)
    engine.start()
    yield engine
    engine.close()


def chat_ids(tokenizer: Any, question: str) -> list[int]:
    """Prompt ids of one user turn with the generation prompt."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def request(tokenizer: Any, rid: str, question: str = "What is 7 + 5?", **sampling: Any) -> GenerationRequest:
    """A chat request for `question` with the given sampling params."""
    return GenerationRequest(rid, input_ids=chat_ids(tokenizer, question),
                             sampling=SamplingParams(**sampling))


def run(coro: Any) -> Any:
    """Run a coroutine on a fresh event loop."""
    return asyncio.run(coro)


def perturbed_state(model_path: str, factor: float = 0.7) -> dict[str, Any]:
    """Every layer's mlp.down_proj scaled by `factor` (HF names): a policy whose greedy output
    differs from the checkpoint's, standing in for a trainer's update."""
    import os

    from safetensors import safe_open

    with safe_open(os.path.join(model_path, "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) * factor for k in f.keys() if k.endswith("mlp.down_proj.weight")}


def reference_greedy(model_path: str, state: dict[str, Any], ids: list[int], n: int) -> list[int]:
    """Greedy ids of an independent transformers model carrying `state` (its `generate`)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    model.load_state_dict(state, strict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(ids):].tolist()
