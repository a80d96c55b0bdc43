"""Do tool calls stall the batch? The agent loop with a tool that sleeps vs an instant one, side by side.

Each configuration runs one `EngineRollout` with `rollout.generate=agent` twice in this process,
alternating: once with the calculator (instant) and once with the same calculator behind an
`asyncio.sleep(--sleep)` (default 0.5 s), and prints wall times and their ratio. The loop runs
every sample's tools concurrently with every other sample's decoding, so a sample waiting for its
tool holds up nobody else: the ratio approaches 1 + (its own tool waits) / (generation time), the
lower bound for any loop, and stays far from the ratio of tools run one at a time
(`--serial`: max_concurrent_tools=1, shown for contrast).

- `--engine scripted` (default): 32 samples x 3 turns (two calculator calls each, then the answer)
  from the model-free scripted engine, each token taking `--token-delay` seconds (default 0.02 s,
  50 tokens/s per sequence; the byte tokenizer spends ~210 tokens on the three turns, ~4.5 s).
- `--engine hf`: the real SmolLM2-135M on the hf engine, greedy, a two-shot prompt that makes it
  call the calculator once (32 samples x 2 turns; the model does not chain a second call).

Usage: python bench/agent_tool_stall.py [--engine scripted|hf] [--samples 32] [--sleep 0.5]
       [--token-delay 0.02] [--repeats 1] [--serial]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from pipeline.agent import calculator as calc  # noqa: E402
from pipeline.data.sources import PlainDataSource  # noqa: E402
from pipeline.engines.scripted import ByteTokenizer, ScriptedEngine  # noqa: E402
from pipeline.rollout.engine_rollout import EngineRollout  # noqa: E402

logger = logging.getLogger(__name__)

# seconds the sleeping tool waits (set by --sleep)
SLEEP_S = {"value": 0.5}


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression after a pause (the calculator as a slow remote tool: same
    name, same schema).

    Args:
        expression: the expression.
    """
    await asyncio.sleep(SLEEP_S["value"])
    return calc.calculator(expression)


def _settings(tool: str, serial: bool) -> dict[str, Any]:
    node = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "rollout" / "engine.yaml")["agent"])
    node.update(tools=[tool], max_concurrent_tools=1 if serial else 64, max_turns=4)
    return node


def _args(samples: int, max_len: int, temperature: float) -> SimpleNamespace:
    return SimpleNamespace(
        rollout_batch_size=samples, n_samples_per_prompt=1, over_sampling_batch_size=samples,
        rollout_temperature=temperature, rollout_top_p=1.0, rollout_top_k=-1, rollout_max_response_len=max_len,
        rollout_stop=[], rollout_stop_token_ids=[], reward_key=None, eval_reward_key=None, partial_rollout=False,
        mask_offpolicy_in_partial_rollout=False, n_samples_per_eval_prompt=1, seed=0, eval_prompt_data=None,
        allowed_targets=["pipeline.", "bench."], allowed_targets_extra=[], apply_chat_template_kwargs={})


def _questions(path: Path, n: int, two_shot: bool) -> Path:
    rng = random.Random(0)
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'
    shots = [{"role": "system", "content": "You can call the calculator tool: " + call % "..."}]
    for q, e, r in (("What is 2 + 3?", "2 + 3", "5"), ("What is 7 * 8?", "7 * 8", "56")):
        shots += [{"role": "user", "content": q}, {"role": "assistant", "content": call % e},
                  {"role": "tool", "content": r}, {"role": "assistant", "content": f"The answer is \\boxed{{{r}}}."}]
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            question = f"What is {a} + {b}?"
            prompt = shots + [{"role": "user", "content": question}] if two_shot else question
            f.write(json.dumps({"input": prompt, "label": str(a + b)}) + "\n")
    return path


def measure(engine: Any, tokenizer: Any, tool: str, samples: int, data: Path, *, serial: bool = False,
            max_len: int = 512, temperature: float = 1.0) -> tuple[float, dict[str, Any]]:
    """(wall seconds, metrics) of one agent rollout of `samples` samples with `tool`."""
    source = PlainDataSource(prompt_data=str(data), n_samples_per_prompt=1, shuffle=False, label_key="label",
                             apply_chat_template=False)
    rollout = EngineRollout(engine=engine, tokenizer=tokenizer, generate="agent", agent=_settings(tool, serial),
                            progress=False, summary=False)
    start = time.perf_counter()
    out = rollout(_args(samples, max_len, temperature), 0, source)
    return time.perf_counter() - start, out.metrics


def main() -> None:
    """Run the comparison and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("scripted", "hf"), default="scripted")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--sleep", type=float, default=0.5)
    parser.add_argument("--token-delay", type=float, default=0.02)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--serial", action="store_true", help="also run with max_concurrent_tools=1")
    opts = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    SLEEP_S["value"] = opts.sleep
    folder = Path(tempfile.mkdtemp(prefix="agent_stall_"))
    if opts.engine == "hf":
        from pipeline.engines.assets import default_cache_dir, resolve_checkpoint
        from pipeline.engines.hf import HFEngine

        engine = HFEngine(resolve_checkpoint("smollm2-135m-instruct", default_cache_dir()),
                          max_batch_size=opts.samples)
        engine.start()
        tokenizer, temperature, max_len = engine.tokenizer, 0.0, 96
    else:
        engine = ScriptedEngine(tool_calls=2, token_delay=opts.token_delay, max_filler=0)
        tokenizer, temperature, max_len = ByteTokenizer(), 1.0, 512
    data = _questions(folder / "q.jsonl", opts.samples, two_shot=opts.engine == "hf")
    tools = {"instant": "pipeline.agent.calculator.calculator", "sleeps": "bench.agent_tool_stall.calculator"}
    runs = [("instant", False), ("sleeps", False)] + ([("sleeps", True)] if opts.serial else [])
    times: dict[tuple[str, bool], list[float]] = {r: [] for r in runs}
    metrics: dict[tuple[str, bool], dict[str, Any]] = {}
    measure(engine, tokenizer, tools["instant"], min(opts.samples, 4), data, max_len=max_len,
            temperature=temperature)  # warm-up
    for _ in range(opts.repeats):
        for name, serial in runs:
            wall, m = measure(engine, tokenizer, tools[name], opts.samples, data, serial=serial, max_len=max_len,
                              temperature=temperature)
            times[(name, serial)].append(wall)
            metrics[(name, serial)] = m
    getattr(engine, "close", lambda: None)()
    base = min(times[("instant", False)])
    calls = metrics[("sleeps", False)]["agent/tool_calls"] / opts.samples
    print(f"engine={opts.engine} samples={opts.samples} turns/sample="
          f"{metrics[('instant', False)]['agent/turns_mean']:.2f} tool calls/sample={calls:.2f} sleep={opts.sleep} s")
    print("| tool | wall s (best of repeats) | ratio to instant |")
    print("|---|---|---|")
    for name, serial in runs:
        best = min(times[(name, serial)])
        label = f"{name}{' (max_concurrent_tools=1)' if serial else ''}"
        print(f"| {label} | {best:.2f} | {best / base:.3f} |")
    print(f"lower bound of the ratio (each sample waits {calls * opts.sleep:.2f} s for its own tools): "
          f"{(base + calls * opts.sleep) / base:.3f}")
    print(f"ratio sleeping/instant: {min(times[('sleeps', False)]) / base:.3f}")


if __name__ == "__main__":
    main()
