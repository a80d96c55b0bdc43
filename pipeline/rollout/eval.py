"""Eval with an engine: every prompt of each configured dataset, n samples each (docs/contracts.md §6).

`EngineEval` is built from `conf/eval/engine.yaml` (datasets with name, prompt_data, keys,
`n_samples_per_eval_prompt` and sampling overrides) or, from inside `EngineRollout`, from slime's
`args.eval_prompt_data`. It returns `RolloutFnEvalOutput` with
`{name: {"rewards", "truncated", "samples"}}` (samples sorted by index, rewards read with
`eval_reward_key or reward_key`) and metrics `eval/<name>`, `eval/<name>-truncated_ratio`,
`eval/<name>-pass@k` (the unbiased estimator 1 − C(n−c, k) / C(n, k), averaged over prompts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

import numpy as np

from pipeline.agent.loop import AgentLoop
from pipeline.data.dataset import PromptDataset
from pipeline.data.sources import prompt_groups
from pipeline.rollout.async_loop import run_sync
from pipeline.rollout.contracts import RolloutFnEvalOutput
from pipeline.rollout.rollout_report import Progress, format_summary
from pipeline.rollout.sample_hooks import SampleHooks
from pipeline.rollout.sample_generate import (
    GenContext, bind, call_custom_generate, default_generate, is_finished, load_generate_fn, release,
    resolve_tokenizer, sampling_params_from_args,
)
from pipeline.samples.sample import Sample
from pipeline.samples.meta import coerce_status

__all__ = ["EngineEval", "pass_at_k", "EVAL_DATASET_KEYS"]

logger = logging.getLogger(__name__)

# keys a dataset entry may carry; a missing / null one falls back to the run's value
EVAL_DATASET_KEYS = (
    "name", "prompt_data", "input_key", "label_key", "metadata_key", "tool_key", "apply_chat_template",
    "apply_chat_template_kwargs", "max_prompt_len", "n_samples_per_eval_prompt", "temperature",
    "top_p", "top_k", "max_response_len", "stop",
)
# the prompt-reading keys of a dataset entry; one neither the entry nor args set keeps
# PromptDataset's default, slime's (args lacks them with data_source=slime, which reads them from
# +input_key etc., or with a slime driver's args)
_SOURCE_KEYS = ("input_key", "label_key", "metadata_key", "tool_key", "apply_chat_template",
                "apply_chat_template_kwargs")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with n samples of which c passed (Chen et al. 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _ks(n: int) -> list[int]:
    ks = [1]
    while ks[-1] * 2 <= n:
        ks.append(ks[-1] * 2)
    if ks[-1] != n:
        ks.append(n)
    return ks


class EngineEval:
    """Eval function `(args, rollout_id, data_source, evaluation=True)` over configured datasets."""

    def __init__(
        self,
        *,
        engine: Any,
        datasets: list[dict[str, Any]],
        reward: Any = None,
        tokenizer: Any = None,
        custom_generate_path: str | None = None,
        generate: str = "default",
        agent: dict[str, Any] | None = None,
        agent_loop: AgentLoop | None = None,
        sample_hooks: SampleHooks | None = None,
        pass_threshold: float = 0.5,
        max_concurrency: int | None = None,
        progress: bool = True,
        summary: bool = True,
    ) -> None:
        if engine is None:
            raise ValueError("eval=engine needs an engine (config group engine/)")
        if not datasets:
            raise ValueError("eval.datasets: expected at least one {name, prompt_data} entry")
        self.datasets = [self._check_dataset(i, d) for i, d in enumerate(datasets)]
        self.engine = engine
        self.reward = reward
        # None: the engine's tokenizer, looked up (and the engine started) at the first call
        self.tokenizer = tokenizer
        self.custom_generate_path = custom_generate_path
        if generate not in ("default", "agent"):
            raise ValueError(f"eval.generate: expected default or agent, got {generate!r}")
        if generate == "agent" and custom_generate_path:
            raise ValueError(f"eval.generate=agent and eval.custom_generate_path={custom_generate_path!r} both name "
                             f"the per-sample generate; keep one")
        # the agent loop (eval.generate=agent, or the rollout's loop when EngineRollout builds this eval)
        self.agent = agent_loop or (AgentLoop(agent or {}, "eval.agent") if generate == "agent" else None)
        # slime's rollout sample hooks (rollout_sample_hook_path), injected by the app
        self.sample_hooks = sample_hooks or SampleHooks()
        self.pass_threshold = float(pass_threshold)
        self.max_concurrency = max_concurrency
        self.progress = bool(progress)
        self.summary = bool(summary)

    @staticmethod
    def _check_dataset(i: int, d: Any) -> dict[str, Any]:
        if isinstance(d, dict) and "path" in d and "prompt_data" not in d:  # the earlier spelling
            logger.warning("eval.datasets[%d].path is deprecated: the prompt file key is prompt_data", i)
            d = {("prompt_data" if k == "path" else k): v for k, v in d.items()}
        if not isinstance(d, dict) or "name" not in d or "prompt_data" not in d:
            raise ValueError(f"eval.datasets[{i}]: expected a mapping with name and prompt_data, got {d!r}")
        unknown = sorted(set(d) - set(EVAL_DATASET_KEYS))
        if unknown:
            raise ValueError(f"eval.datasets[{i}] ({d['name']}): unknown keys {unknown}; "
                             f"expected some of {list(EVAL_DATASET_KEYS)}")
        return dict(d)

    @classmethod
    def from_args(cls, args: Any, **parts: Any) -> EngineEval:
        """Datasets from slime's flat `args.eval_prompt_data = [name1, path1, name2, path2, ...]`."""
        flat = args.eval_prompt_data
        if not flat or len(flat) % 2:
            raise ValueError("evaluation requested but no eval datasets are configured: set eval=engine "
                             f"(conf/eval/engine.yaml) or args.eval_prompt_data; got {flat!r}")
        datasets = [{"name": flat[i], "prompt_data": flat[i + 1]} for i in range(0, len(flat), 2)]
        return cls(datasets=datasets, **parts)

    def __call__(self, args: Any, rollout_id: int, data_source: Any = None,
                 evaluation: bool = True) -> RolloutFnEvalOutput:
        """slime's eval-function signature; `data_source` (the train source) is not used."""
        return run_sync(self.aevaluate(args, rollout_id))

    async def aevaluate(self, args: Any, rollout_id: int) -> RolloutFnEvalOutput:
        """Evaluate every dataset; returns the data and the metrics."""
        start = time.perf_counter()
        self.tokenizer = await resolve_tokenizer(self.tokenizer, self.engine)
        ctx = GenContext(engine=self.engine, tokenizer=self.tokenizer, rollout_id=int(rollout_id),
                         agent=self.agent.run_for(args) if self.agent is not None else None)
        bind(ctx)
        data: dict[str, dict[str, Any]] = {}
        metrics: dict[str, Any] = {}
        for spec in self.datasets:
            groups = self._load(args, spec)
            samples = await self._generate(args, ctx, spec, groups)
            data[spec["name"]] = self._collect(args, samples)
            metrics.update(self._metrics(spec["name"], data[spec["name"]]))
        if ctx.agent is not None:  # the agent loop's counters over every dataset, as eval_agent/<name>
            metrics.update({f"eval_agent/{k.split('/', 1)[1]}": v for k, v in ctx.agent.metrics().items()})
        metrics["perf/eval_time"] = time.perf_counter() - start
        release(ctx)
        if self.summary:
            logger.info("%s", format_summary(f"eval at rollout {rollout_id}", metrics))
        return RolloutFnEvalOutput(data=data, metrics=metrics)

    def _value(self, args: Any, spec: dict[str, Any], key: str, arg_name: str) -> Any:
        value = spec.get(key)
        # args may lack the data-source names (see _SOURCE_KEYS): getattr, not attribute access
        return value if value is not None else getattr(args, arg_name, None)

    def _load(self, args: Any, spec: dict[str, Any]) -> list[list[Sample]]:
        n = int(self._value(args, spec, "n_samples_per_eval_prompt", "n_samples_per_eval_prompt") or 1)
        kwargs = {key: self._value(args, spec, key, key) for key in _SOURCE_KEYS}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        dataset = PromptDataset(spec["prompt_data"], tokenizer=self.tokenizer, max_prompt_len=spec.get("max_prompt_len"),
                                **kwargs)
        return prompt_groups(dataset, np.arange(len(dataset)), n)

    async def _generate(self, args: Any, ctx: GenContext, spec: dict[str, Any],
                        groups: list[list[Sample]]) -> list[Sample]:
        overrides = {"temperature": spec.get("temperature"), "top_p": spec.get("top_p"),
                     "top_k": spec.get("top_k"), "max_new_tokens": spec.get("max_response_len"),
                     "stop": spec.get("stop")}
        params = sampling_params_from_args(args, overrides=overrides)
        sem = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
        bar = Progress(sum(len(g) for g in groups), f"eval {spec['name']}", self.progress)

        group_rm = bool(getattr(args, "group_rm", None) or getattr(self.reward, "group_rm", False))

        async def score(samples: list[Sample]) -> None:
            todo = [s for s in samples if is_finished(s) and s.reward is None]
            if self.reward is not None and todo:
                for s, r in zip(todo, await self.reward.score(args, todo)):
                    s.reward = r

        async def one(sample: Sample) -> list[Sample]:
            path = sample.generate_function_path or self.custom_generate_path
            async with sem or contextlib.nullcontext():
                if path:
                    fn = load_generate_fn(ctx, args, path)
                    out = await call_custom_generate(fn, path, args, sample, params, True)
                else:
                    out = await default_generate(ctx, args, sample, params, True)
            if self.sample_hooks:
                out = await self.sample_hooks.apply(args, out, rollout_id=ctx.rollout_id, evaluation=True)
            outs = out if isinstance(out, list) else [out]
            if not group_rm:
                await score(outs)  # as each sample finishes, concurrently with generation
            bar.update(len(outs), ctx.tokens_generated)
            return outs

        async def group(g: list[Sample]) -> list[Sample]:
            outs = [s for sample_outs in await asyncio.gather(*(one(s) for s in g)) for s in sample_outs]
            if group_rm:
                await score(outs)
            return outs

        try:
            results = await asyncio.gather(*(group(g) for g in groups))
        finally:
            bar.close()
        samples = [s for outs in results for s in outs]
        return sorted(samples, key=lambda s: (s.index if s.index is not None else -1))

    def _collect(self, args: Any, samples: list[Sample]) -> dict[str, Any]:
        key = args.eval_reward_key or args.reward_key
        rewards = []
        for s in samples:
            r = s.reward
            if key:
                if not isinstance(r, dict) or key not in r:
                    raise ValueError(f"eval sample {s.index}: reward {r!r} has no key {key!r} "
                                     "(eval_reward_key / reward_key)")
                r = r[key]
            rewards.append(r)
        truncated = [coerce_status(s.status) == Sample.Status.TRUNCATED for s in samples]
        return {"rewards": rewards, "truncated": truncated, "samples": samples}

    def _metrics(self, name: str, d: dict[str, Any]) -> dict[str, Any]:
        rewards = [float(r) for r in d["rewards"] if r is not None]
        out: dict[str, Any] = {
            f"eval/{name}": sum(rewards) / len(rewards) if rewards else float("nan"),
            f"eval/{name}-truncated_ratio": sum(d["truncated"]) / max(1, len(d["truncated"])),
        }
        by_group: dict[Any, list[float]] = {}
        for s, r in zip(d["samples"], d["rewards"]):
            by_group.setdefault(s.group_index, []).append(float(r) if r is not None else float("-inf"))
        sizes = {len(v) for v in by_group.values()}
        if len(sizes) == 1:
            n = sizes.pop()
            for k in _ks(n):
                vals = [pass_at_k(n, sum(r >= self.pass_threshold for r in v), k) for v in by_group.values()]
                out[f"eval/{name}-pass@{k}"] = sum(vals) / len(vals)
        return out
