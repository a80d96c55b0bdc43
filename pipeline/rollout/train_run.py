"""One train rollout of `EngineRollout`: the over-sampling loop of docs/contracts.md §6.

While (submitted − dropped) < rollout_batch_size (`adaptive`: while the projected count is short,
see `over_sampling`), fetch groups and submit each as a task that
generates its samples concurrently and scores each sample as soon as it finishes. As groups
finish, the dynamic filter keeps or drops them (drop iff not keep and not (keep_when_insufficient
and remaining ≤ target)). When the batch is full, in-flight generation is aborted; unfinished
groups go back to the buffer with partial_rollout (without it: dropped, or back as fresh prompts
when nothing of them was generated yet), completed surplus groups are carried to the next
rollout when the source is buffered (a completed group whose oldest token is more than
`surplus_max_staleness` weight versions behind the engine's is regenerated instead of reused).
A buffered source without partial_rollout lets the groups in flight finish instead (`finish_surplus`): the over-sampled rounds fill its buffer.

Weight versions: the engine's `weight_version` is published to buffer filters while the rollout
fetches (`pipeline.samples.versions.serving_version`), and `rollout/weight_staleness` (max over the
batch's response tokens of serving version minus the token's version) and
`rollout/weight_staleness_mean` (mean over tokens) are logged.

Deterministic mode: per-sample seeds come from (seed, group_index, position); each fetch is
submitted in index order and groups are decided strictly in that order, so the batch is the
first rollout_batch_size groups that pass the dynamic filter, whatever the completion timing.
Every group not admitted (surplus or unfinished) goes back to the buffer reset to a fresh
prompt, in index order: what had been generated for it depends on timing, its seeded
regeneration does not. With `batch_invariant_log_probs` (on with deterministic by default)
requests ask the engine for log-probs that do not depend on what it batched them with either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from typing import Any

from pipeline.rewards.dispatch import reward_counts
from pipeline.rollout.contracts import RolloutFnTrainOutput, as_filter_output
from pipeline.rollout.groups import buffer_size, first_index, flatten_group, group_key, response_tokens
from pipeline.rollout.leftover_groups import Flight, LeftoverGroups
from pipeline.rollout.rollout_report import Progress, format_summary
from pipeline.rollout.sample_generate import (
    GenContext, bind, call_custom_generate, default_generate, encode_prompts, is_finished,
    load_generate_fn, release, reset_sample, resolve_tokenizer, sample_seed, sampling_params_from_args,
    snapshot,
)
from pipeline.samples.sample import Sample
from pipeline.samples.versions import group_staleness, set_serving_version, staleness_metrics

__all__ = ["TrainRun"]

logger = logging.getLogger(__name__)

# a rollout that has submitted this many times its batch (then twice, four times as many...) with
# the batch still short logs why: a dynamic filter passing (almost) nothing fetches for ever, as
# slime's loop does (the batch keeps its exact size; the warning is the only sign)
STARVING_FACTOR = 20


class TrainRun(LeftoverGroups):
    """State of one `EngineRollout` train call (see module docstring); where the groups the batch
    did not take go is `LeftoverGroups` (pipeline/rollout/leftover_groups.py)."""

    def __init__(self, owner: Any, args: Any, rollout_id: int, data_source: Any) -> None:
        # the `EngineRollout` this call belongs to: engine, reward, dynamic filter, settings
        self.engine_rollout = owner
        self.args = args
        self.rollout_id = int(rollout_id)
        self.data_source = data_source
        self.target = int(args.rollout_batch_size)
        self.over_sampling_batch_size = int(args.over_sampling_batch_size)
        if self.over_sampling_batch_size < self.target:
            raise ValueError(f"over_sampling_batch_size ({self.over_sampling_batch_size}) must be >= "
                             f"rollout_batch_size ({self.target})")
        self.buffered = hasattr(data_source, "buffer") and hasattr(data_source, "add_samples")
        if args.partial_rollout and not self.buffered:
            raise ValueError("partial_rollout=true needs a buffered data source (data_source=buffered); "
                             f"got {type(data_source).__name__}")
        self.ctx = GenContext(engine=owner.engine, tokenizer=owner.tokenizer, rollout_id=self.rollout_id,
                              batch_invariant=owner.batch_invariant_log_probs,
                              agent=owner.agent.run_for(args) if getattr(owner, "agent", None) else None)
        self.params = sampling_params_from_args(args)
        self.sem = asyncio.Semaphore(owner.max_concurrency) if owner.max_concurrency else None
        self.tasks: dict[asyncio.Task, Flight] = {}
        self.finished: dict[int, Flight] = {}
        self.kept: list[Flight] = []
        # every group the dynamic filter decided on, kept or dropped (slime's all_samples)
        self.decided_flights: list[Flight] = []
        self.next_order = self.next_decide = 0
        self.submitted = self.dropped = self.accepted = self.decided = 0
        self._starving_at = STARVING_FACTOR * self.target
        self.count: Counter[str] = Counter()
        self.progress: Progress | None = None
        # group-mode rewards (slime's group_rm) score a whole group once all of it is generated
        self.group_rm = bool(getattr(args, "group_rm", None) or getattr(owner.reward, "group_rm", False))
        # groups headed back to the buffer, added in one call at the end
        self._pending_buffer: list[list[Any]] = []
        # the reward's counted failures before this rollout (reward/* metrics: this rollout's share)
        self._reward_counts = reward_counts(owner.reward)

    # ------------------------------------------------------------------ main loop
    async def execute(self) -> RolloutFnTrainOutput:
        """Run the rollout; returns exactly rollout_batch_size groups sorted by first index."""
        start = time.perf_counter()
        owner = self.engine_rollout
        owner.tokenizer = self.ctx.tokenizer = await resolve_tokenizer(owner.tokenizer, owner.engine)
        bind(self.ctx)
        if hasattr(self.data_source, "begin_rollout"):
            self.data_source.begin_rollout(self.rollout_id)
        self.progress = Progress(self.target * int(self.args.n_samples_per_prompt),
                                 f"rollout {self.rollout_id}", self.engine_rollout.progress,
                                 lambda: buffer_size(self.data_source))
        try:
            self._top_up()
            while len(self.kept) < self.target:
                done, _ = await asyncio.wait(list(self.tasks), return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: self.tasks[t].order):
                    flight = self.tasks.pop(task)
                    task.result()  # a plugin error surfaces here
                    self.finished[flight.order] = flight
                self._decide_ready()
            await self._finish()
        except BaseException:
            await self._cancel_all()
            raise
        finally:
            self.progress.close()
            release(self.ctx)  # HTTP requests after this rollout do not see its abort
        elapsed = time.perf_counter() - start
        self.engine_rollout.over_sampler.end_rollout(self.accepted, self.decided)
        groups = [f.group for f in sorted(self.kept, key=lambda f: first_index(f.group))]
        all_groups = [f.group for f in sorted(self.decided_flights, key=lambda f: first_index(f.group))]
        metrics = self._metrics(elapsed)
        if self.engine_rollout.summary:
            logger.info("%s", format_summary(f"rollout {self.rollout_id} done in {elapsed:.2f}s", metrics))
        return RolloutFnTrainOutput(samples=groups, metrics=metrics, all_samples=all_groups)

    def serving_version(self) -> int:
        """The weight version the engine serves now (0 for an engine that cannot update)."""
        return int(getattr(self.engine_rollout.engine, "weight_version", 0))

    def _full(self) -> bool:
        return len(self.kept) >= self.target

    def _top_up(self) -> None:
        sampler = self.engine_rollout.over_sampler
        while not self._full():
            shortfall = sampler.shortfall(self.target, self.submitted, self.dropped, len(self.kept),
                                          self.accepted, self.decided, self.over_sampling_batch_size)
            if shortfall <= 1e-6:
                return
            k = sampler.fetch_size(self.target, self.over_sampling_batch_size, shortfall, self.accepted,
                                   self.decided, self.submitted)
            buffered_ids = self._buffered_ids()
            set_serving_version(self.serving_version())  # for buffer filters bounding staleness
            groups = self.data_source.get_samples(k)
            if buffered_ids:
                self.count["groups_from_buffer"] += sum(id(flatten_group(g)[0]) in buffered_ids for g in groups if g)
            if not groups:
                raise RuntimeError(f"rollout {self.rollout_id}: the data source returned no groups "
                                   f"when asked for {k}")
            self.count["fetch_rounds"] += 1
            self.count["groups_fetched"] += len(groups)
            if self.engine_rollout.deterministic:  # admitted in index order, whatever the source's order
                groups = sorted(groups, key=group_key)
            encode_prompts(self.ctx.tokenizer, [s for g in groups for s in g
                                                if isinstance(s, Sample) and not is_finished(s)])
            for group in groups:
                flight = Flight(self.next_order, list(group))
                self.next_order += 1
                self.tasks[asyncio.create_task(self._run_group(flight))] = flight
                self.submitted += 1
            self._warn_if_starving()

    def _warn_if_starving(self) -> None:
        """Once this rollout has submitted STARVING_FACTOR x its batch, and at every doubling after,
        log what the dynamic filter dropped: one that passes nothing makes the rollout fetch for ever."""
        if self.submitted < self._starving_at:
            return
        self._starving_at *= 2
        prefix = "dynamic_filter/drop_"
        drops = ", ".join(f"{k.removeprefix(prefix)} {n}" for k, n in sorted(self.count.items())
                          if k.startswith(prefix))
        logger.warning("rollout %d: %d groups submitted for a batch of %d, %d kept so far (dynamic filter drops: %s); "
                       "a dynamic filter that passes (almost) nothing keeps this rollout fetching for ever, as "
                       "slime's does: check the rewards (rollout/raw_reward), or let it keep groups when short "
                       "(dynamic_filter=nonzero_std_fallback)", self.rollout_id, self.submitted, self.target,
                       len(self.kept), drops or "none yet")

    def _buffered_ids(self) -> set[int]:
        """ids of the first sample of every group in the source's buffer (to count what it serves)."""
        buffer = getattr(self.data_source, "buffer", None) if self.buffered else None
        return {id(g[0]) for g in buffer or () if isinstance(g, list) and g}

    def _decide_ready(self) -> None:
        """Decide finished groups: strictly in submission order when deterministic."""
        while not self._full():
            if self.engine_rollout.deterministic:
                if self.next_decide not in self.finished:
                    return
                order = self.next_decide
                self.next_decide += 1
            elif self.finished:
                order = min(self.finished)
            else:
                return
            self._decide(self.finished.pop(order))
            self._top_up()

    def _verdict(self, flight: Flight) -> Any:
        if self.engine_rollout.dynamic_filter is None:
            return None
        out = self.engine_rollout.dynamic_filter(self.args, flight.group)
        return as_filter_output(out, "dynamic_filter")

    def _decide(self, flight: Flight) -> None:
        if not all(is_finished(s) for s in flatten_group(flight.group)):
            # aborted by the engine (or a plugin) before the batch was full: cannot be used now
            self.dropped += 1
            self._park_unfinished(flight, self._pending_buffer)
            return
        verdict = self._verdict(flight)
        self.decided += 1
        self.decided_flights.append(flight)
        remaining = self.submitted - self.dropped
        if verdict is not None and not verdict.keep and not (
            verdict.keep_when_insufficient and remaining <= self.target
        ):
            self.dropped += 1
            self.count[f"dynamic_filter/drop_{verdict.reason or 'filtered'}"] += 1
            self._count_waste(flight)
            return
        self.kept.append(flight)
        if verdict is not None and not verdict.keep:
            # kept only because dropping it would leave the batch short: not a pass (the
            # over-sampling estimate and rollout/filter_pass_rate count passes)
            self.count["dynamic_filter/kept_insufficient"] += 1
        else:
            self.accepted += 1

    # ------------------------------------------------------------------ per group / sample
    async def _run_group(self, flight: Flight) -> None:
        items = flight.group
        if items and not any(isinstance(s, list) for s in items) and all(is_finished(s) for s in items):
            if group_staleness(items, self.serving_version()) > self.engine_rollout.surplus_max_staleness:
                self.count["wasted_buffer_tokens"] += response_tokens(items)
                for s in items:
                    reset_sample(s)
                self.count["stale_groups_regenerated"] += 1
            else:
                self.count["surplus_groups_reused"] += 1
        results = await asyncio.gather(*(self._run_item(flight, i, s) for i, s in enumerate(items)))
        flight.group = list(results)
        reward = self.engine_rollout.reward
        if reward is not None and self.group_rm:
            todo = [s for s in flatten_group(flight.group) if is_finished(s) and s.reward is None]
            if todo:
                for s, r in zip(todo, await reward.score(self.args, todo)):
                    s.reward = r

    async def _run_item(self, flight: Flight, pos: int, sample: Any) -> Any:
        params = self.params
        if self.engine_rollout.deterministic:
            params = {**params, "seed": sample_seed(self.engine_rollout.seed, sample.group_index, pos)}
        out: Any = sample
        if not is_finished(sample) and not self.ctx.aborted:
            before = sample.response_length
            path = sample.generate_function_path or self.engine_rollout.custom_generate_path
            async with self.sem or contextlib.nullcontext():
                if path:
                    flight.originals[pos] = snapshot(sample)
                    fn = load_generate_fn(self.ctx, self.args, path)
                    out = await call_custom_generate(fn, path, self.args, sample, params, False)
                else:
                    out = await default_generate(self.ctx, self.args, sample, params)
            # as in slime, not on a sample the abort reached before it was sent to the engine
            untouched = self.ctx.aborted and out is sample and sample.response_length == before
            if self.engine_rollout.sample_hooks and not untouched:
                out = await self.engine_rollout.sample_hooks.apply(self.args, out, rollout_id=self.rollout_id,
                                                                   evaluation=False)
            if isinstance(out, list):
                if all(s.rollout_id is None for s in out):
                    for s in out:  # fan-out siblings share one trajectory id
                        s.rollout_id = sample.index
                flight.tokens += sum(s.response_length for s in out) - before
            else:
                flight.tokens += out.response_length - before
        reward = self.engine_rollout.reward
        done = [s for s in (out if isinstance(out, list) else [out]) if is_finished(s)]
        if reward is not None and not self.group_rm:
            for s in done:
                if s.reward is None:
                    s.reward = (await reward.score(self.args, [s]))[0]
        if done and self.progress is not None:
            self.progress.update(len(done), self.ctx.tokens_generated)
        return out

    async def _cancel_all(self) -> None:
        self.ctx.aborted = True
        if not self.tasks:
            return
        with contextlib.suppress(Exception):
            await self.engine_rollout.engine.abort_all()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()

    def _metrics(self, elapsed: float) -> dict[str, Any]:
        m: dict[str, Any] = {f"rollout/{k}": 0 for k in (
            "aborted_groups_to_buffer", "aborted_groups_dropped", "aborted_groups_restarted",
            "surplus_groups_carried", "surplus_groups_dropped", "surplus_groups_finished", "surplus_groups_reused",
            "stale_groups_regenerated",
            "groups_from_buffer", "groups_to_buffer", "wasted_tokens", "wasted_buffer_tokens")}
        m.update({f"rollout/{k}": v for k, v in self.count.items()})
        m["rollout/groups_submitted"] = self.submitted
        m["rollout/groups_dropped"] = self.dropped
        m["rollout/continued_samples"] = self.ctx.continued_samples
        m["rollout/tokens_generated"] = self.ctx.tokens_generated
        m["rollout/http_requests"] = self.ctx.http_requests  # through the SGLang-compatible /generate
        m["rollout/tokens_per_kept_group"] = self.ctx.tokens_generated / max(1, self.target)
        m["rollout/filter_pass_rate"] = self.accepted / self.decided if self.decided else 1.0
        m["rollout/pass_rate_ema"] = self.engine_rollout.over_sampler.pass_rate
        m["rollout/buffer_size"] = buffer_size(self.data_source)
        m["perf/rollout_generate_time"] = elapsed
        m["rollout/gen_tokens_per_sec"] = self.ctx.tokens_generated / max(elapsed, 1e-9)
        m["rollout/offpolicy_tokens_masked"] = self.ctx.offpolicy_tokens_masked
        m.update({k: v - self._reward_counts.get(k, 0) for k, v in reward_counts(self.engine_rollout.reward).items()})
        m.update(self._staleness())
        if self.ctx.agent is not None:  # rollout.generate=agent: turns, tool calls, latency, tool tokens
            m.update(self.ctx.agent.metrics())
        return m

    def _staleness(self) -> dict[str, float]:
        """`rollout/weight_staleness` (max) and `_mean` over the kept samples' response tokens of
        known version: serving version minus the version that made the token."""
        return staleness_metrics((s for f in self.kept for s in flatten_group(f.group)), self.serving_version())
