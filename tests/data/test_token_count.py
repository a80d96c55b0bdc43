"""The pre-token shortcut for prompt lengths equals full tokenisation (kept row set included)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pipeline.data.dataset import PromptDataset
from pipeline.data.lengths import TokenizerHandle
from pipeline.data.token_count import PretokenCounter
from tests.data.conftest import write_jsonl

ROOT = Path(__file__).resolve().parents[2]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PIECES = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'", "  ", "   ", " ", "don't", "it's",
          "123", "4567", "3.14", "?!", "...", "--", "(x)", "a_b", "CamelCase", "apples", "Train",
          "x'sy", " 's", "@#$%", "~", "`", "\\", '"', "{}", "[1,2]", "+", "=", "  9", "9  a"]
WORDS = ["the", "what", "is", "apple", "cost", "total", "number", "compute", "answer", "step"]


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small byte-level BPE (GPT-2 pipeline) with special tokens, saved as an HF folder."""
    tmp = tmp_path_factory.mktemp("bpe")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(1)
    corpus = [" ".join(rng.choices(WORDS + PIECES, k=12)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(tmp)
    return str(tmp)


def adversarial_texts(n: int, seed: int = 0) -> list[str]:
    """Printable-ASCII prompts built to hit every regex branch, plus texts the shortcut must skip."""
    rng = random.Random(seed)
    out = ["", " ", "  ", "a", " a", "a ", "a  b", "'s", " 's's", "x" * 300]
    while len(out) < n:
        parts = [rng.choice(WORDS + PIECES) for _ in range(rng.randint(1, 30))]
        glue = rng.choice([" ", "", "  ", " "])
        text = glue.join(parts)
        if rng.random() < 0.3:
            text = "".join(chr(rng.randint(32, 126)) for _ in range(rng.randint(1, 80)))
        roll = rng.random()
        if roll < 0.04:
            text += rng.choice(SPECIALS) + "tail"  # an added token: must be encoded in full
        elif roll < 0.08:
            text += rng.choice(["\n", "\t", "é", "日本", "\u00a0", "\r\n"]) + "x"
        out.append(text)
    return out


@pytest.mark.timeout(120)
def test_counts_equal_full_tokenisation(bpe_folder: str) -> None:
    folder = bpe_folder
    handle = TokenizerHandle(folder)
    texts = adversarial_texts(4000)
    full = [len(handle.obj.encode(t, add_special_tokens=False)) for t in texts]
    import tokenizers

    fast = tokenizers.Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    assert PretokenCounter.create(fast) is not None  # the shortcut is really taken
    assert handle.count(texts).tolist() == full


@pytest.mark.timeout(120)
def test_kept_rows_equal_full_tokenisation(tmp_path: Path, bpe_folder: str) -> None:
    folder = bpe_folder
    texts = [t for t in adversarial_texts(3000, seed=7) if t.strip()]  # a blank prompt is a bad row
    path = write_jsonl(tmp_path / "p.jsonl", [{"input": t} for t in texts])
    handle = TokenizerHandle(folder)
    full = [len(handle.obj.encode(t, add_special_tokens=False)) for t in texts]
    limit = sorted(full)[len(full) // 2]
    ds = PromptDataset(path, tokenizer=folder, max_prompt_len=limit)
    assert ds.rows.tolist() == [i for i, c in enumerate(full) if c <= limit]
    assert ds.too_long == sum(c > limit for c in full) > 0


@pytest.mark.timeout(120)
def test_bundled_model_tokenizer_when_present() -> None:
    folders = sorted((ROOT / ".cache").glob("models/*/tokenizer.json"))
    if not folders:
        pytest.skip("no converted model tokenizer under .cache/models")
    handle = TokenizerHandle(str(folders[0].parent))
    texts = adversarial_texts(3000, seed=3)
    assert handle.count(texts).tolist() == [len(handle.obj.encode(t, add_special_tokens=False)) for t in texts]


def test_ineligible_pipelines_fall_back() -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    assert PretokenCounter.create(tok) is None  # a prefix space changes the first piece
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert PretokenCounter.create(tok) is not None
    tok.normalizer = normalizers.NFKC()
    assert PretokenCounter.create(tok) is None
    word = Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    assert PretokenCounter.create(word) is None


@pytest.mark.timeout(120)
def test_small_batches_and_cache_resets_keep_counts(bpe_folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.data import lengths, token_count

    monkeypatch.setattr(lengths, "BATCH", 97)
    monkeypatch.setattr(token_count, "_MAX_CACHE", 150)  # forces the piece cache to reset often
    handle = TokenizerHandle(bpe_folder)
    texts = adversarial_texts(1500, seed=11)
    assert handle.count(texts).tolist() == [len(handle.obj.encode(t, add_special_tokens=False)) for t in texts]
