"""Benchmark of the data layer on a generated 1M-prompt JSONL (run by `make bench-data`, not CI).

Reports cold and warm start with the length filter, get_samples throughput at n=8, checkpoint
save+load with 10,000 buffered groups of 8, and peak RSS. Each phase runs in a fresh child
process so start-up and RSS are measured honestly.

    python bench/data_source.py [--rows 1000000] [--workdir .cache/bench_data]
"""

from __future__ import annotations

import argparse
import array
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"cold_start_s": 40.0, "warm_start_s": 2.0, "samples_per_s": 300_000.0,
           "checkpoint_roundtrip_s": 1.0, "peak_rss_gb": 2.0}
WORDS = ("the a of to and in is for on with as by at from that this what how many apples train "
         "cost each total find compute number sum product difference value answer step").split()


def generate(path: Path, rows: int) -> None:
    """A JSONL of arithmetic-style prompts with 4..50 extra words, a label and metadata."""
    rng = random.Random(0)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for i in range(rows):
            a, b = rng.randint(1, 999), rng.randint(1, 999)
            words = " ".join(rng.choices(WORDS, k=rng.randint(4, 50)))
            f.write(json.dumps({"input": f"What is {a} + {b}? {words}", "label": str(a + b),
                                "metadata": {"id": i, "source": "bench"}}) + "\n")
    tmp.replace(path)


def find_tokenizer(workdir: Path, data: Path) -> str:
    """The converted SmolLM2 tokenizer under .cache when present, else a BPE trained here."""
    for tok in sorted((ROOT / ".cache").glob("models/*/tokenizer.json")):
        return str(tok.parent)
    folder = workdir / "bpe_tokenizer"
    if not (folder / "tokenizer.json").exists():
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel()
        with open(data) as f:
            sample = [json.loads(next(f))["input"] for _ in range(20_000)]
        tok.train_from_iterator(sample, trainers.BpeTrainer(vocab_size=4000, special_tokens=["<unk>"]))
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(folder)
    return str(folder)


def _cpu() -> float:
    """CPU seconds of this process, all threads (the tokenizer's Rust threads included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(phase: str, data: str, tokenizer: str, cache: str, max_len: int) -> dict[str, float]:
    """One measured phase in this (fresh) process."""
    sys.path.insert(0, str(ROOT))
    from pipeline import BufferedDataSource, PlainDataSource, Sample

    out: dict[str, float] = {}
    t0, c0 = time.perf_counter(), _cpu()
    cls = BufferedDataSource if phase == "checkpoint" else PlainDataSource
    src = cls(prompt_data=data, n_samples_per_prompt=8, seed=42, tokenizer=tokenizer, max_prompt_len=max_len,
              cache_dir=cache, save_dir=str(Path(cache) / "ckpt"), label_key=None, apply_chat_template=False)
    out["start_s"], out["start_cpu_s"] = time.perf_counter() - t0, _cpu() - c0
    out["prompts"] = len(src)
    out["too_long"] = src.dataset.too_long
    if phase in ("cold", "warm"):  # the epoch-0 permutation: computed cold, cached for warm
        t0 = time.perf_counter()
        src.get_samples(1)
        out["first_fetch_s"] = time.perf_counter() - t0
    if phase == "warm":
        n_samples, t0, c0 = 0, time.perf_counter(), _cpu()
        while time.perf_counter() - t0 < 3.0:
            for _ in range(20):
                n_samples += sum(len(g) for g in src.get_samples(256))
        out["samples_per_s"] = n_samples / (time.perf_counter() - t0)
        out["samples_per_cpu_s"] = n_samples / (_cpu() - c0)
    if phase == "checkpoint":
        groups = src.get_samples(10_000)
        # distinct log-probs per sample, as a float32 engine returns them (exact in float32)
        rng = random.Random(0)
        for g in groups:
            for j, s in enumerate(g):
                log_probs = [float(x) for x in array.array("f", [-5.0 * rng.random() for _ in range(32)])]
                s.tokens = list(range(1000, 1032))
                s.append_response_tokens(tokens=list(range(j, j + 32)), log_probs=log_probs,
                                         text="partial answer " * 4, meta_info={"finish_reason": {"type": "abort"}})
                s.reward = 0.5
                s.metadata["start_rollout_id"] = 3
        src.add_samples(groups)
        t0, c0 = time.perf_counter(), _cpu()
        path = src.save(3)
        out["save_s"], out["save_cpu_s"] = time.perf_counter() - t0, _cpu() - c0
        out["checkpoint_mb"] = path.stat().st_size / 1e6
        fresh = BufferedDataSource(prompt_data=data, n_samples_per_prompt=8, seed=42, tokenizer=tokenizer,
                                   max_prompt_len=max_len, cache_dir=cache, save_dir=str(Path(cache) / "ckpt"), label_key=None, apply_chat_template=False)
        t0, c0 = time.perf_counter(), _cpu()
        assert fresh.load() == 3 and fresh.get_buffer_length() == 10_000
        out["load_s"], out["load_cpu_s"] = time.perf_counter() - t0, _cpu() - c0
        assert fresh.buffer[-1][-1].to_dict() == src.buffer[-1][-1].to_dict()
        assert isinstance(fresh.buffer[0][0], Sample)
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux
    return out


def spawn(phase: str, data: Path, tokenizer: str, cache: Path, max_len: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", phase, "--data", str(data), "--tokenizer", tokenizer,
           "--cache", str(cache), "--max-prompt-len", str(max_len)]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workdir", default=str(ROOT / ".cache" / "bench_data"))
    ap.add_argument("--max-prompt-len", type=int, default=48)
    ap.add_argument("--child")
    ap.add_argument("--data")
    ap.add_argument("--tokenizer")
    ap.add_argument("--cache")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.data, a.tokenizer, a.cache, a.max_prompt_len)))
        return
    workdir = Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / f"prompts_{a.rows}.jsonl"
    if not data.exists():
        t0 = time.perf_counter()
        generate(data, a.rows)
        print(f"generated {data} ({data.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")
    tokenizer = find_tokenizer(workdir, data)
    with open(data) as f:
        avg = sum(len(json.loads(line)["input"]) for line, _ in zip(f, range(10_000))) / 10_000
    print(f"data: {data} ({a.rows} rows, {data.stat().st_size / 1e6:.0f} MB, prompts ~{avg:.0f} chars), "
          f"tokenizer: {tokenizer}, max_prompt_len={a.max_prompt_len}")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=workdir) as cache:
        cold = spawn("cold", data, tokenizer, Path(cache), a.max_prompt_len)
        warm = spawn("warm", data, tokenizer, Path(cache), a.max_prompt_len)
        ck = spawn("checkpoint", data, tokenizer, Path(cache), a.max_prompt_len)
    res = {"cold_start_s": cold["start_s"], "warm_start_s": warm["start_s"],
           "samples_per_s": warm["samples_per_s"], "checkpoint_roundtrip_s": ck["save_s"] + ck["load_s"],
           "peak_rss_gb": max(cold["peak_rss_gb"], warm["peak_rss_gb"], ck["peak_rss_gb"])}
    print(f"load average (1 min) before/after: {load_before:.1f} / {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores (other work on the machine slows the wall-clock numbers)")
    print(f"CPU seconds: cold start {cold['start_cpu_s']:.1f}, warm start {warm['start_cpu_s']:.2f}, "
          f"checkpoint save {ck['save_cpu_s']:.2f} + load {ck['load_cpu_s']:.2f}; "
          f"get_samples {warm['samples_per_cpu_s']:,.0f} samples per CPU-second")
    print(f"prompts kept: {cold['prompts']:.0f} ({cold['too_long']:.0f} longer than {a.max_prompt_len} tokens)")
    print(f"first get_samples (epoch-0 permutation): cold {cold['first_fetch_s']:.2f} s, "
          f"warm {warm['first_fetch_s']:.3f} s (permutation cached)")
    print(f"checkpoint: save {ck['save_s']:.2f} s + load {ck['load_s']:.2f} s, {ck['checkpoint_mb']:.1f} MB")
    print(f"peak RSS per phase (GB): cold {cold['peak_rss_gb']:.2f}, warm {warm['peak_rss_gb']:.2f}, "
          f"checkpoint {ck['peak_rss_gb']:.2f}")
    print(f"{'metric':<24}{'measured':>14}{'target':>12}  ok")
    for key, target in TARGETS.items():
        value = res[key]
        ok = value >= target if key == "samples_per_s" else value <= target
        print(f"{key:<24}{value:>14,.2f}{target:>12,.1f}  {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
