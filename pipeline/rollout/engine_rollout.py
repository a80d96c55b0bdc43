"""The default rollout: asynchronous over-sampling against an `Engine` (docs/contracts.md §6).

`EngineRollout` is built from `conf/rollout/engine.yaml` by `pipeline.config.plugins.build(cfg.rollout,
engine=..., reward=..., dynamic_filter=..., tokenizer=...)` and called like any slime rollout
function: `rollout(args, rollout_id, data_source, evaluation=False)`. The call is synchronous;
the work runs on the shared rollout loop (`pipeline.rollout.async_loop`). The over-sampling loop
itself lives in `pipeline.rollout.train_run`; an eval call delegates to `pipeline.rollout.eval`.
"""

from __future__ import annotations

import logging
from typing import Any

from pipeline.agent.loop import AgentLoop
from pipeline.rollout.async_loop import run_sync
from pipeline.rollout.contracts import RolloutFnEvalOutput, RolloutFnTrainOutput
from pipeline.rollout.eval import EngineEval
from pipeline.rollout.over_sampling import OverSampler
from pipeline.rollout.sample_hooks import SampleHooks
from pipeline.rollout.train_run import TrainRun

__all__ = ["EngineRollout"]

logger = logging.getLogger(__name__)


class EngineRollout:
    """Over-sampling rollout with dynamic filter, abort, partial rollout and surplus carry-over.

    Runtime parts (injected by `build`): `engine` (an `Engine`), `reward` (an object with
    `async score(args, samples) -> list`, or None to leave rewards unset), `dynamic_filter`
    (`fn(args, samples, **kw) -> DynamicFilterOutput | bool`, or None), `tokenizer` (falls back
    to `engine.tokenizer`), `evaluator` (an eval function; built from `args` when None),
    `sample_hooks` (slime's rollout sample hooks, `pipeline.rollout.sample_hooks.SampleHooks`).
    The remaining keyword arguments mirror `conf/rollout/engine.yaml`, which documents them.
    """

    def __init__(
        self,
        *,
        engine: Any,
        reward: Any = None,
        dynamic_filter: Any = None,
        tokenizer: Any = None,
        evaluator: Any = None,
        sample_hooks: SampleHooks | None = None,
        over_sampling: str = "fixed",
        adaptive: dict[str, Any] | None = None,
        carry_surplus: bool = True,
        finish_surplus: bool = True,
        surplus_max_staleness: int = 1,
        custom_generate_path: str | None = None,
        generate: str = "default",
        agent: dict[str, Any] | None = None,
        deterministic: bool = False,
        seed: int = 0,
        batch_invariant_log_probs: bool = False,
        max_concurrency: int | None = None,
        progress: bool = True,
        summary: bool = True,
    ) -> None:
        if engine is None:
            raise ValueError("rollout=engine needs an engine (config group engine/)")
        if surplus_max_staleness < 0:
            raise ValueError(f"rollout.surplus_max_staleness: expected >= 0, got {surplus_max_staleness}")
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"rollout.max_concurrency: expected a positive integer or null, got {max_concurrency}")
        self.engine = engine
        self.reward = reward
        self.dynamic_filter = dynamic_filter
        # None: the engine's tokenizer, looked up (and the engine started) at the first call
        self.tokenizer = tokenizer
        self.evaluator = evaluator
        self.sample_hooks = sample_hooks or SampleHooks()
        unknown = sorted(set(adaptive or {}) - set(OverSampler.ADAPTIVE_KEYS))
        if unknown:
            raise ValueError(f"rollout.adaptive: unknown keys {unknown}; expected {list(OverSampler.ADAPTIVE_KEYS)}")
        self.over_sampler = OverSampler(mode=over_sampling, **dict(adaptive or {}))
        self.carry_surplus = bool(carry_surplus)
        self.finish_surplus = bool(finish_surplus)
        self.surplus_max_staleness = int(surplus_max_staleness)
        self.custom_generate_path = custom_generate_path
        # rollout.generate=agent: the agent loop (pipeline/agent/loop.py) generates every sample
        self.agent = _agent_loop(generate, agent, custom_generate_path, "rollout")
        self.deterministic = bool(deterministic)
        self.seed = int(seed)
        self.batch_invariant_log_probs = bool(batch_invariant_log_probs)
        self.max_concurrency = max_concurrency
        self.progress = bool(progress)
        self.summary = bool(summary)
        self.last_metrics: dict[str, Any] = {}
        # the weight version a resumed checkpoint was written at (see load_state_dict)
        self.resumed_weight_version = 0

    def __call__(
        self, args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
    ) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
        """slime's rollout-function signature; blocks until the batch (or eval) is done."""
        if evaluation:
            return self._evaluator(args)(args, rollout_id, data_source, evaluation=True)
        return run_sync(self.agenerate(args, rollout_id, data_source))

    async def agenerate(self, args: Any, rollout_id: int, data_source: Any) -> RolloutFnTrainOutput:
        """The train branch as a coroutine (for callers already on the rollout loop)."""
        run = TrainRun(self, args, rollout_id, data_source)
        output = await run.execute()
        self.last_metrics = dict(output.metrics or {})
        return output

    def _evaluator(self, args: Any) -> Any:
        if self.evaluator is None:
            self.evaluator = EngineEval.from_args(
                args, engine=self.engine, reward=self.reward, tokenizer=self.tokenizer,
                custom_generate_path=self.custom_generate_path, progress=self.progress,
                sample_hooks=self.sample_hooks, agent_loop=self.agent,
            )
        return self.evaluator

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state carried across rollouts: the adaptive pass-rate estimate and the
        weight version the engine serves (0 for an engine that cannot update)."""
        return {"over_sampler": self.over_sampler.state_dict(),
                "weight_version": int(getattr(self.engine, "weight_version", 0))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output. The weights themselves are the trainer's to restore:
        `resumed_weight_version` tells it (and a warning says so) which version the engine must
        get back through `update_weights` before the next rollout."""
        self.over_sampler.load_state_dict(state["over_sampler"])
        self.resumed_weight_version = int(state.get("weight_version", 0))  # checkpoints before versions: 0
        serving = int(getattr(self.engine, "weight_version", 0))
        if self.resumed_weight_version != serving:
            logger.warning("resume: the checkpoint was written at weight version %d, the engine serves %d "
                           "until the trainer sends its restored weights", self.resumed_weight_version, serving)


def _agent_loop(generate: str, agent: dict[str, Any] | None, custom_generate_path: str | None,
                group: str) -> AgentLoop | None:
    """The agent loop `<group>.generate=agent` asks for (None for `default`)."""
    if generate not in ("default", "agent"):
        raise ValueError(f"{group}.generate: expected default or agent, got {generate!r}")
    if generate == "default":
        return None
    if custom_generate_path:
        raise ValueError(f"{group}.generate=agent and {group}.custom_generate_path={custom_generate_path!r} both name "
                         f"the per-sample generate; keep one")
    return AgentLoop(agent or {}, f"{group}.agent")
