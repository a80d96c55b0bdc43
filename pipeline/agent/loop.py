"""The agent loop: generate -> parse tool calls -> run tools -> append the results -> generate again.

`rollout.generate=agent` (conf/rollout/engine.yaml) makes `EngineRollout` / `EngineEval` build one
`AgentLoop` from `rollout.agent`; each rollout / eval call gets an `AgentRun` (its counters and the
tool semaphore shared by all its samples) in `GenContext.agent`, and `default_generate` hands every
sample to `AgentRun.generate`. Per sample, until the model answers without a call, `max_turns` model
turns, or the token budget:

- a model turn asks the engine for min(budget left, `max_tokens_per_turn`) tokens, stopping at the
  format's closing call tag (`stop_at_call`); its tokens are appended exactly as the engine returned
  them (`engine_turn`: loss mask 1, the engine's log-probs and weight versions);
- the calls it makes run concurrently (`ToolRegistry`); a malformed call's error message, or a
  tool's error text (`on_tool_error: message`), is its result; with `on_tool_error: fail` a tool
  error ends the sample FAILED (its output so far kept);
- the results are rendered once (the chat template's tool turn, or the result tags), tokenised once
  and appended with loss mask 0 and log-prob 0.0 (`append_response_tokens(trainable=False)`); they
  count against the budget: a tool turn that does not leave room for a model token is not appended.
Statuses as slime's: the budget (or the per-turn cap) hit -> TRUNCATED, an abort -> ABORTED (a
partial rollout continues the loop later from `metadata["agent"]`), a failed tool -> FAILED, else
COMPLETED. `metadata["agent"]` holds the sample's turns, calls, malformed calls, tool errors, its
spans `[["model" | "tool", n_tokens], ...]` and why it stopped (answer, max_turns, budget,
turn_cap, aborted, tool_error): no timings, so deterministic runs dump byte-identical samples.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from pipeline.agent.config import AgentConfig
from pipeline.agent.formats import ToolCall, make_format
from pipeline.agent.stats import AgentStats
from pipeline.agent.tools import ToolOutcome, ToolRegistry, load_tools
from pipeline.config.plugins import allowed_targets
from pipeline.rollout.sample_generate import (
    continuation_seed, encode_prompt, engine_turn, is_finished, to_engine_params,
)
from pipeline.samples.sample import Sample
from pipeline.samples.versions import mask_older_than_newest

__all__ = ["AgentLoop", "AgentRun"]

logger = logging.getLogger(__name__)


class AgentLoop:
    """The loop's settings and tools, built once per rollout object (tools load at the first call,
    through the allowlist of that call's `args`)."""

    def __init__(self, config: AgentConfig | dict[str, Any], where: str = "rollout.agent") -> None:
        self.config = config if isinstance(config, AgentConfig) else AgentConfig.from_mapping(config, where)
        self.where = where
        self._registry: ToolRegistry | None = None
        self._formats: dict[int, Any] = {}

    def registry(self, args: Any) -> ToolRegistry:
        """The tools (loaded on first use)."""
        if self._registry is None:
            c = self.config
            tools = load_tools(c.tools, c.tool_args, allowed_targets(args), f"{self.where}.tools")
            self._registry = ToolRegistry(tools, timeout_s=c.tool_timeout_s, retries=c.retries, retry_on=c.retry_on,
                                          retry_backoff_s=c.retry_backoff_s, max_result_chars=c.max_result_chars)
        return self._registry

    def format_for(self, tokenizer: Any, args: Any) -> Any:
        """The call format for `tokenizer` (the chat template probed once per tokenizer)."""
        key = id(tokenizer)
        if key not in self._formats:
            kwargs = dict(getattr(args, "apply_chat_template_kwargs", None) or {})
            self._formats[key] = make_format(self.config, self.registry(args), tokenizer, kwargs)
        return self._formats[key]

    def run_for(self, args: Any) -> AgentRun:
        """A fresh run (counters, tool semaphore) for one rollout or eval call."""
        return AgentRun(self, self.registry(args))


def _new_state() -> dict[str, Any]:
    return {"turns": 0, "tool_calls": 0, "malformed_calls": 0, "tool_errors": 0, "spans": [], "stop": None}


class AgentRun:
    """One rollout's (or eval's) use of the loop: `generate` per sample, `metrics()` at the end."""

    def __init__(self, loop: AgentLoop, registry: ToolRegistry) -> None:
        self.loop = loop
        self.config = loop.config
        self.registry = registry
        self.stats = AgentStats()
        self.semaphore = asyncio.Semaphore(self.config.max_concurrent_tools)

    def metrics(self) -> dict[str, float]:
        """This call's `agent/*` metrics (`AgentStats.metrics`)."""
        return self.stats.metrics()

    async def generate(self, ctx: Any, args: Any, sample: Sample, sampling_params: dict,
                       evaluation: bool = False) -> Sample:
        """Run the loop on one sample in place (module docstring)."""
        if ctx.aborted or is_finished(sample):
            return sample
        tok = ctx.tokenizer
        if tok is None:
            raise ValueError("rollout.generate=agent needs a tokenizer (none was injected and the engine has none)")
        fmt = self.loop.format_for(tok, args)
        if sample.response_length == 0:
            state = _new_state()
            text = fmt.prompt_text(sample.prompt, sample.metadata.get("tools"))
            if text is not None:
                sample.tokens = list(tok(text, add_special_tokens=False)["input_ids"])
            elif not sample.tokens:
                sample.tokens = encode_prompt(tok, sample.prompt, sample.metadata.get("tools"))
        else:  # an aborted sample continued (partial rollout)
            state = {**_new_state(), **dict(sample.metadata.get("agent") or {})}
            state["spans"] = [list(s) for s in state["spans"]] or [["model", sample.response_length]]
            ctx.continued_samples += 1
            if args.mask_offpolicy_in_partial_rollout:
                sample.loss_mask = [0] * sample.response_length
        sample.metadata["agent"] = state
        self.stats.samples += 1
        try:
            state["stop"] = await self._turns(ctx, args, sample, sampling_params, fmt, state)
        finally:
            self.stats.stops[state["stop"] or "aborted"] += 1
        return sample

    async def _turns(self, ctx: Any, args: Any, sample: Sample, sampling_params: dict, fmt: Any,
                     state: dict[str, Any]) -> str:
        """The loop proper; returns why it stopped."""
        c = self.config
        total = int(sampling_params["max_new_tokens"])
        base = to_engine_params(sampling_params)
        base = dataclasses.replace(base, stop=tuple(dict.fromkeys([*base.stop, *fmt.stop])),
                                   batch_invariant=base.batch_invariant or ctx.batch_invariant)
        tok = ctx.tokenizer
        special = set(getattr(tok, "all_special_ids", None) or []) | {getattr(tok, "eos_token_id", None)}
        while True:
            remaining = total - sample.response_length
            if remaining <= 0:
                sample.status = Sample.Status.TRUNCATED
                return "budget"
            if ctx.aborted:
                sample.status = Sample.Status.ABORTED
                return "aborted"
            n = min(remaining, c.max_tokens_per_turn) if c.max_tokens_per_turn else remaining
            params = dataclasses.replace(base, max_new_tokens=n)
            if params.seed is not None and sample.response_length:
                response_ids = sample.tokens[len(sample.tokens) - sample.response_length:]
                params = dataclasses.replace(params, seed=continuation_seed(params.seed, response_ids))
            before = sample.response_length
            result = await engine_turn(ctx, args, sample, params)
            got = sample.response_length - before
            self.stats.model_tokens += got
            spans = state["spans"]
            if spans and spans[-1][0] == "model":  # the continuation of an aborted model turn
                spans[-1][1] += got
            else:
                spans.append(["model", got])
                state["turns"] += 1
                self.stats.turns += 1
            if args.mask_offpolicy_in_partial_rollout:
                ctx.offpolicy_tokens_masked += mask_older_than_newest(sample)
            if result.finish_reason == "abort":
                return "aborted"
            if result.finish_reason == "length":
                return "budget" if n == remaining else "turn_cap"
            turn_ids = sample.tokens[len(sample.tokens) - spans[-1][1]:]
            calls = fmt.parse(tok.decode(turn_ids, skip_special_tokens=True))
            if not calls:
                return "answer"
            if state["turns"] >= c.max_turns:
                return "max_turns"
            outcomes = await asyncio.gather(*(self._run(call) for call in calls))
            for call, out in zip(calls, outcomes):
                if call.error is not None:
                    state["malformed_calls"] += 1
                    self.stats.malformed_calls += 1
                    continue
                state["tool_calls"] += 1
                self.stats.tool_calls += 1
                self.stats.latencies.append(out.latency_s)
                if out.error:
                    state["tool_errors"] += 1
                    self.stats.tool_errors += 1
                    self.stats.tool_timeouts += int(out.timed_out)
            failed = [o for call, o in zip(calls, outcomes) if call.error is None and o.error]
            if failed and c.on_tool_error == "fail":
                sample.status = Sample.Status.FAILED
                state["error"] = failed[0].text
                return "tool_error"
            last = turn_ids[-1] if turn_ids else None
            last_text = tok.decode([last], skip_special_tokens=False) if last in special else ""
            text = fmt.result_text(last_text, [o.text for o in outcomes], [call.name for call in calls])
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
            if len(ids) >= total - sample.response_length:
                sample.status = Sample.Status.TRUNCATED
                return "budget"
            sample.append_response_tokens(args, tokens=ids, trainable=False,
                                          text=tok.decode(ids, skip_special_tokens=True))
            self.stats.tool_tokens += len(ids)
            spans.append(["tool", len(ids)])

    async def _run(self, call: ToolCall) -> ToolOutcome:
        if call.error is not None:
            return ToolOutcome(call.error, error=True)
        return await self.registry.call(call.name, call.arguments, self.semaphore)
