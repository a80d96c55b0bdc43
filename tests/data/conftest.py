"""Fixtures of the data-layer tests: prompt files and a tiny fast tokenizer with a chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

CHAT_TEMPLATE = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def write_jsonl(path: Path, rows: list[Any]) -> str:
    """Write one JSON value per line; returns the path as a string."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def make_rows(n: int, **extra: Any) -> list[dict[str, Any]]:
    """Rows q0..q{n-1} with a label and a metadata dict."""
    return [{"input": f"q{i}", "label": str(i), "metadata": {"i": i}, **extra} for i in range(n)]


def build_tokenizer(folder: Path) -> str:
    """A whitespace word-level fast tokenizer (one token per word) saved as a HF folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(50)] + [f"q{i}" for i in range(50)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", chat_template=CHAT_TEMPLATE)
    fast.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Path of the tiny tokenizer folder."""
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
def data5(tmp_path: Path) -> str:
    """Five rows q0..q4 as JSONL."""
    return write_jsonl(tmp_path / "q.jsonl", make_rows(5))
