"""The end of one train rollout (`TrainRun`): where the groups the batch did not take go.

When the batch is full, groups still in flight either finish (a buffered source without
partial_rollout: its over-sampled surplus fills the buffer) or are aborted. A completed surplus
group is carried to the next rollout through the buffer when the source is buffered (reset to a
fresh prompt in deterministic mode), else dropped; an unfinished group goes back to be continued
(partial_rollout), goes back as fresh prompts (buffered source, nothing generated yet, or
deterministic mode: no prompt is lost), or is dropped. Everything headed for the buffer is added
in one `add_samples` call.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipeline.rollout.groups import flatten_group, response_tokens
from pipeline.rollout.sample_generate import GenContext, is_finished, reset_sample
from pipeline.samples.sample import Sample

__all__ = ["Flight", "LeftoverGroups"]


@dataclass
class Flight:
    """A group in this rollout: submission order, its items, response tokens generated now."""

    order: int
    group: list[Any]
    tokens: int = 0
    originals: dict[int, Sample] = field(default_factory=dict)


class LeftoverGroups:
    """The end-of-rollout half of `TrainRun` (a mixin: it reads the run's state)."""

    engine_rollout: Any
    args: Any
    rollout_id: int
    data_source: Any
    buffered: bool
    ctx: GenContext
    tasks: dict[asyncio.Task, Flight]
    finished: dict[int, Flight]
    count: Counter[str]
    _pending_buffer: list[list[Any]]

    async def _finish(self) -> None:
        if self.tasks and self._finishes_surplus():
            await asyncio.gather(*self.tasks)  # the over-sampled groups complete: buffered surplus
            self.count["surplus_groups_finished"] = len(self.tasks)
            for flight in self.tasks.values():
                self.finished[flight.order] = flight
            self.tasks.clear()
        self.ctx.aborted = True
        if self.tasks:
            await self.engine_rollout.engine.abort_all()
            await asyncio.gather(*self.tasks)
            for flight in self.tasks.values():
                self.finished[flight.order] = flight
            self.tasks.clear()
        for order in sorted(self.finished):
            flight = self.finished[order]
            if all(is_finished(s) for s in flatten_group(flight.group)):
                self._park_surplus(flight)
            else:
                self._park_unfinished(flight, self._pending_buffer)
        self.finished.clear()
        if self._pending_buffer:
            self.data_source.add_samples(self._pending_buffer)
        self.count["groups_to_buffer"] = len(self._pending_buffer)

    def _finishes_surplus(self) -> bool:
        """Whether groups in flight when the batch fills finish instead of being aborted."""
        owner = self.engine_rollout
        return (owner.finish_surplus and self.buffered and owner.carry_surplus and not owner.deterministic
                and not self.args.partial_rollout)

    def _count_waste(self, flight: Flight) -> None:
        """Count the tokens of a group about to be thrown away (dropped or reset): those generated
        in this rollout in rollout/wasted_tokens, those it brought from the buffer (generated in
        earlier rollouts: carried surplus, continued partial responses) in
        rollout/wasted_buffer_tokens. Call it before the samples are reset."""
        self.count["wasted_tokens"] += flight.tokens
        self.count["wasted_buffer_tokens"] += max(0, response_tokens(flight.group) - flight.tokens)

    def _mark_start(self, samples: list[Any]) -> None:
        for s in samples:
            if s.response_length and "start_rollout_id" not in s.metadata:
                s.metadata["start_rollout_id"] = self.rollout_id

    def _park_surplus(self, flight: Flight) -> None:
        # not filtered here: the dynamic filter decides when the group is used next rollout
        if self.buffered and self.engine_rollout.carry_surplus and not any(isinstance(s, list) for s in flight.group):
            if self.engine_rollout.deterministic:
                # whether a surplus group finished before the batch filled depends on timing:
                # carry it as fresh prompts so the buffer (and its regeneration) is the same
                self._count_waste(flight)
                for s in flight.group:
                    reset_sample(s)
            self._mark_start(flight.group)
            self._pending_buffer.append(flight.group)
            self.count["surplus_groups_carried"] += 1
        else:
            self.count["surplus_groups_dropped"] += 1
            self._count_waste(flight)

    def _park_unfinished(self, flight: Flight, pending: list[list[Any]]) -> None:
        """An unfinished group: to the buffer to be continued (partial_rollout), to the buffer as
        fresh prompts (buffered source without partial_rollout, when nothing of it was generated
        yet, or always in deterministic mode: no prompt is lost), else dropped."""
        partial = bool(self.args.partial_rollout)
        restart = not partial and self.buffered and self.engine_rollout.carry_surplus and (
            self.engine_rollout.deterministic or self._unstarted(flight))
        if not partial and not restart:
            self.count["aborted_groups_dropped"] += 1
            self._count_waste(flight)
            return
        if self.engine_rollout.deterministic:
            self._count_waste(flight)  # every sample restarts from its prompt (below)
        group = []
        for pos, item in enumerate(flight.group):
            if isinstance(item, list):  # a fan-out cannot be continued: restart its sample
                item = flight.originals[pos]
                reset_sample(item)
            elif self.engine_rollout.deterministic or restart:
                # what got generated before the abort depends on timing; seeded regeneration does not
                reset_sample(item)
            group.append(item)
        self._mark_start(group)
        pending.append(group)
        self.count["aborted_groups_to_buffer" if partial else "aborted_groups_restarted"] += 1

    @staticmethod
    def _unstarted(flight: Flight) -> bool:
        """Nothing of the group was generated (it was fetched, then aborted before its turn)."""
        return flight.tokens == 0 and all(not isinstance(s, list) and not s.response_length for s in flight.group)
