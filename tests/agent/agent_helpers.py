"""Helpers of the agent-loop tests (a unique module name: test dirs share sys.path)."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
import rollout_helpers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def agent_settings(**over: Any) -> dict[str, Any]:
    """conf/rollout/engine.yaml's `agent` block (the defaults) with `over` applied."""
    node = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "rollout" / "engine.yaml")["agent"])
    node.update(over)
    return node


def make_args(**over: Any) -> SimpleNamespace:
    """The rollout tests' slime-named args (tests/rollout/rollout_helpers.py) with the allowlist
    the agent's tool paths go through, plus overrides."""
    allow = dict(allowed_targets=["pipeline.", "builtins.dict", "builtins.list", "functools.partial"],
                 allowed_targets_extra=["tests."], apply_chat_template_kwargs={})
    return rollout_helpers.make_args(**{**allow, **over})


# the rollout tests' `n` rows {"input": "What is a + b?", "label": "a+b"}
write_questions = rollout_helpers.write_prompts
# 1.0 when the last \\boxed{} of the response equals the label (the dispatcher's shape)
BoxedReward = rollout_helpers.BoxedReward


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
