"""The kill/resume harness for runs with a trainer: a tiny policy, the CLI overrides, and the
comparison of a resumed run's training against an uninterrupted run's.

The policy is a random 2-layer Llama (hidden size 16) with SmolLM2's tokenizer, saved as a local
HF folder: the real hf engine generates from it and the real policy-gradient trainer trains it
(full fine-tuning, AdamW, two optimizer steps per rollout), in seconds. Its sampled tokens and
log-probs depend on the weights, so a resume that skipped or repeated an update, or left the
engine on other weights, shows in the sample dumps too (`harness.compare`).

Compared (`compare_training`), deterministic mode, bit for bit:
- the final trainer state `<run>/trainer/rollout_<last>/`: policy tensors, optimizer tensors
  (exp_avg, exp_avg_sq, step, the torch RNG state) and trainer_state.json (weight version,
  optimizer step, param groups, Python / numpy RNG states);
- the loss curve: every `train/*` metric of every step (perf/* timings excluded);
- the train data tensors `train_data/rollout_<r>.safetensors` and their JSON side files;
- the exported policy `<run>/policy/model.safetensors`;
and that no half-written temp folder (`.rollout_*`, `.policy.*`) is left in the resumed run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

# SmolLM2's tokenizer files, copied next to the tiny random weights
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def tiny_policy(folder: Path, seed: int = 0) -> Path:
    """A random Llama (2 layers, hidden 16) with the bundled SmolLM2's vocabulary and tokenizer,
    saved as a HF folder that `hf_checkpoint=<folder>` loads."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.engines.assets import default_cache_dir, resolve_checkpoint

    source = Path(resolve_checkpoint("smollm2-135m-instruct", default_cache_dir()))
    base = json.loads((source / "config.json").read_text())
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=base["vocab_size"], hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, bos_token_id=base.get("bos_token_id"),
                         eos_token_id=base.get("eos_token_id"))
    LlamaForCausalLM(config).save_pretrained(str(folder), safe_serialization=True)
    for name in _TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)
    return folder


def train_overrides(data: Path, policy: Path, num_rollout: int) -> list[str]:
    """A deterministic run with a trainer: hf engine on `policy`, buffered source with partial
    rollout (an aborted group's tokens carry over), a reproducible random reward (the random
    policy never solves the sums), 2 prompts x 2 samples, 4 new tokens, two optimizer steps of
    two samples per rollout."""
    return [
        "engine=hf", f"hf_checkpoint={policy}", "engine.num_threads=1", "engine.max_batch_size=8",
        "reward=random", "data_source=buffered", f"data_source.prompt_data={data}", "data_source.label_key=label",
        "dynamic_filter=none", "partial_rollout=true", "save_interval=1", "rollout_batch_size=2",
        "over_sampling_batch_size=3", "n_samples_per_prompt=2", "rollout_max_response_len=4",
        f"num_rollout={num_rollout}", "logger=jsonl", "rollout.progress=false", "rollout.summary=false",
        "rollout.deterministic=true", "trainer=policy_gradient", "trainer.lr=1e-2", "trainer.num_threads=1",
        "trainer.global_batch_size=2", "trainer.micro_batch_size=1",
    ]


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _tensor_problems(what: str, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    if a.keys() != b.keys():
        return [f"{what}: tensor names differ: {sorted(set(a) ^ set(b))[:5]}"]
    return [f"{what}: {name} differs" for name in a
            if a[name].dtype != b[name].dtype or a[name].shape != b[name].shape or not (a[name] == b[name]).all()]


def train_curve(run_dir: Path) -> list[dict[str, Any]]:
    """(step, train/* metrics) of every metrics line."""
    return [{k: v for k, v in row.items() if k == "step" or k.startswith("train/")} for row in _metrics(run_dir)]


def compare_training(ref: Path, got: Path, num_rollout: int) -> list[str]:
    """What differs between the training of the resumed run `got` and the uninterrupted `ref`
    (module docstring); empty when nothing does."""
    problems: list[str] = []
    last = f"trainer/rollout_{num_rollout - 1}"
    for name in ("policy.safetensors", "optimizer.safetensors"):
        problems += _tensor_problems(f"{last}/{name}", load_file(str(ref / last / name)),
                                     load_file(str(got / last / name)))
    state_a, state_b = (json.loads((d / last / "trainer_state.json").read_text()) for d in (ref, got))
    if state_a != state_b:
        problems.append(f"{last}/trainer_state.json differs: "
                        f"{ {k: (state_a.get(k), state_b.get(k)) for k in state_a if state_a.get(k) != state_b.get(k)} }")
    curve_a, curve_b = train_curve(ref), train_curve(got)
    if curve_a != curve_b:
        problems.append(f"train/* metrics differ: {curve_a} vs {curve_b}")
    for r in range(num_rollout):
        name = f"train_data/rollout_{r}"
        problems += _tensor_problems(f"{name}.safetensors", load_file(str(ref / f"{name}.safetensors")),
                                     load_file(str(got / f"{name}.safetensors")))
        if (ref / f"{name}.json").read_bytes() != (got / f"{name}.json").read_bytes():
            problems.append(f"{name}.json differs")
    exported = "policy/model.safetensors"
    if not (got / exported).is_file():
        problems.append(f"{exported} missing")
    else:
        problems += _tensor_problems(exported, load_file(str(ref / exported)), load_file(str(got / exported)))
    leftovers = [str(p.relative_to(got)) for p in [*got.glob(".policy.*"), *(got / "trainer").glob(".rollout_*")]]
    if leftovers:
        problems.append(f"half-written folders left behind: {leftovers}")
    return problems


_PIDS = re.compile(r"rank (\d+) pid (\d+) on")


def kill_worker(args: list[str], run_dir: Path, marks: Path, nth: int, rank: int, pause: float = 4.0,
                delay: float = 0.0, log_dir: Path | None = None) -> tuple[int, str]:
    """Start the CLI run (`args`, with trainer.num_workers > 1; `run_dir` its hydra.run.dir,
    `log_dir` the run dir it writes into: itself, or the run a `resume=` continues), SIGKILL trainer
    worker `rank` when the driver reaches its `nth` `distributed_train` mark (it pauses there
    `pause` seconds; with `delay` the kill comes that long after the mark: `pause=0` and a small
    delay lands it inside the step); returns (the run's exit code, its run.log and stderr). The
    run must stop by itself within 30 s of the kill."""
    import harness

    marks.write_text("")
    err = marks.with_suffix(".stderr")
    with open(err, "w") as out:
        proc = subprocess.Popen([sys.executable, str(harness.DRIVER), *args, f"hydra.run.dir={run_dir}"],
                                cwd=harness.ROOT, env=harness._env(marks, pause), stdout=subprocess.DEVNULL,
                                stderr=out)
    deadline = time.monotonic() + 240
    while f"distributed_train {nth}\n" not in marks.read_text():
        if proc.poll() is not None:
            return proc.returncode, err.read_text()  # finished (or failed) before the kill point
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"the run never reached distributed_train {nth}")
        time.sleep(0.02)
    time.sleep(delay)
    log = (log_dir or run_dir) / "run.log"
    # the newest process's workers: the last line naming each rank
    pids = {int(r): int(p) for r, p in _PIDS.findall(log.read_text())}
    os.kill(pids[rank], signal.SIGKILL)
    started = time.monotonic()
    code = proc.wait(timeout=120)
    if time.monotonic() - started > 30 + pause:
        raise AssertionError(f"the run took {time.monotonic() - started:.0f} s to stop after the worker was killed")
    return code, log.read_text() + err.read_text()


def stop_driver(args: list[str], run_dir: Path, marks: Path, nth: int, signum: int,
                pause: float = 4.0, group: bool = False) -> tuple[int, str, dict[int, int], float]:
    """Start the CLI run (`args`, trainer.num_workers > 1, into `run_dir`) and send its main
    process `signum` while it pauses at its `nth` `distributed_train` mark (with `group`, the run
    starts a session of its own and the signal goes to its whole process group, Ray's processes
    included, as `timeout` without `--foreground` or SLURM's `scancel` send it); returns (its exit
    code, its run.log and stderr, the workers' pids by rank, the seconds it took to exit)."""
    import harness

    marks.write_text("")
    err = marks.with_suffix(".stderr")
    with open(err, "w") as out:
        proc = subprocess.Popen([sys.executable, str(harness.DRIVER), *args, f"hydra.run.dir={run_dir}"],
                                cwd=harness.ROOT, env=harness._env(marks, pause, "distributed_train"),
                                stdout=subprocess.DEVNULL, stderr=out, start_new_session=group)
    deadline = time.monotonic() + 240
    try:
        while f"distributed_train {nth}\n" not in marks.read_text():
            if proc.poll() is not None:
                raise AssertionError(f"the run ended ({proc.returncode}) before distributed_train {nth}: "
                                     f"{err.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run never reached distributed_train {nth}")
            time.sleep(0.02)
        pids = {int(r): int(p) for r, p in _PIDS.findall((run_dir / "run.log").read_text())}
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        started = time.monotonic()
        code = proc.wait(timeout=120)
        took = time.monotonic() - started
    finally:
        proc.kill()
    return code, (run_dir / "run.log").read_text() + err.read_text(), pids, took


def alive(pid: int) -> bool:
    """Whether a process with `pid` still runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
