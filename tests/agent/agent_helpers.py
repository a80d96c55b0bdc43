"""Helpers of the agent-loop tests (a unique module name: test dirs share sys.path)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]


def agent_settings(**over: Any) -> dict[str, Any]:
    """conf/rollout/engine.yaml's `agent` block (the defaults) with `over` applied."""
    node = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "rollout" / "engine.yaml")["agent"])
    node.update(over)
    return node


def make_args(**over: Any) -> SimpleNamespace:
    """slime-named args with the run config's defaults plus overrides (the allowlist included)."""
    base = dict(
        rollout_batch_size=4, n_samples_per_prompt=2, over_sampling_batch_size=None,
        rollout_temperature=1.0, rollout_top_p=1.0, rollout_top_k=-1, rollout_max_response_len=256,
        rollout_stop=[], rollout_stop_token_ids=[], reward_key=None, eval_reward_key=None,
        partial_rollout=False, mask_offpolicy_in_partial_rollout=False, n_samples_per_eval_prompt=1,
        input_key="input", label_key="label", seed=1234, eval_prompt_data=None,
        allowed_targets=["pipeline.", "builtins.dict", "builtins.list", "functools.partial"],
        allowed_targets_extra=["tests."], apply_chat_template_kwargs={},
    )
    base.update(over)
    if base["over_sampling_batch_size"] is None:
        base["over_sampling_batch_size"] = base["rollout_batch_size"]
    return SimpleNamespace(**base)


def write_questions(path: Path, n: int, seed: int = 0) -> Path:
    """`n` rows {"input": "What is a + b?", "label": "a+b"}."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randint(1, 50), rng.randint(1, 50)
            f.write(json.dumps({"input": f"What is {a} + {b}?", "label": str(a + b)}) + "\n")
    return path


def turns_engine(turns: list[str], **kw: Any):
    """A scripted engine whose k-th model turn (k = tool results seen so far) is `turns[k]`."""
    from pipeline.engines.scripted import ScriptedEngine

    class TurnsEngine(ScriptedEngine):
        def script_for(self, prompt_text: str, rng: random.Random) -> str:
            seen = prompt_text.count("\ntool: ") + prompt_text.count("<information>")
            return turns[min(seen, len(turns) - 1)]

    return TurnsEngine(**kw)


def run_agent(tmp_path: Path, engine: Any, n_groups: int = 2, n: int = 2, tokenizer: Any = None, reward: Any = None,
              args: dict[str, Any] | None = None, **settings: Any):
    """One EngineRollout call with rollout.generate=agent over `n_groups` questions; (output, rollout)."""
    from pipeline.data.sources import PlainDataSource
    from pipeline.engines.scripted import ByteTokenizer
    from pipeline.rollout.engine_rollout import EngineRollout

    rollout_kw = {k: settings.pop(k) for k in ("deterministic", "max_concurrency") if k in settings}
    src = PlainDataSource(prompt_data=str(write_questions(tmp_path / "q.jsonl", 16)), n_samples_per_prompt=n,
                          shuffle=False, label_key="label", apply_chat_template=False)
    rollout = EngineRollout(engine=engine, reward=reward, tokenizer=tokenizer or ByteTokenizer(), generate="agent",
                            agent=agent_settings(**settings), progress=False, summary=False, **rollout_kw)
    out = rollout(make_args(rollout_batch_size=n_groups, n_samples_per_prompt=n, **(args or {})), 0, src)
    return out, rollout


def samples_of(out: Any) -> list[Any]:
    """The output's samples, flat, by index."""
    return sorted((s for g in out.samples for s in g), key=lambda s: s.index)


def spans_ok(sample: Any) -> None:
    """The sample's tokens, masks and log-probs agree with its recorded spans."""
    sample.check_lengths()
    spans = sample.metadata["agent"]["spans"]
    assert sum(n for _, n in spans) == sample.response_length
    mask = [1 if kind == "model" else 0 for kind, n in spans for _ in range(n)]
    assert sample.loss_mask == mask
    pos = 0
    for kind, n in spans:
        lps = sample.rollout_log_probs[pos:pos + n]
        if kind == "tool":
            assert lps == [0.0] * n
        pos += n


class BoxedReward:
    """1.0 when the last \\boxed{} of the response equals the label (the dispatcher's shape)."""

    async def score(self, args: Any, samples: list[Any]) -> list[float]:
        import re
        out = []
        for s in samples:
            found = re.findall(r"\\boxed\{([^}]*)\}", s.response)
            out.append(1.0 if found and found[-1].strip() == str(s.label) else 0.0)
        return out
