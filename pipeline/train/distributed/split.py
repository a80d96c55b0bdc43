"""Which worker trains which samples: every optimizer step's samples split over the workers,
balanced by tokens (torch-free; the driver runs it on the rollout's train data).

A step's samples are dealt out in units: the samples of one prompt together (GRPO's group,
whose prompt the worker then runs once: `share_prompt_forward`) when the step has at least as
many prompts as workers, single samples otherwise. Units go, largest first, to the worker with
the fewest tokens so far (ties: the lowest rank), the longest-processing-time rule: no worker
gets more than 4/3 of the optimum. A worker keeps its samples in the rollout's order.

`plan_shares` turns the split of each step into one share per worker: the global indices of
its samples (in order) and, per optimizer step, the positions of that step's samples in its
share (an empty list when the step had fewer samples than workers: the worker then runs empty
micro-batches its peers' collectives need, `pipeline.train.parallel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["Share", "balance", "plan_shares", "prompt_keys", "slice_train_data"]


@dataclass(frozen=True)
class Share:
    """One worker's part of a rollout's train data."""

    # indices into the rollout's samples, ascending
    samples: list[int]
    # per optimizer step: positions into `samples`
    steps: list[list[int]]

    def num_tokens(self, total_lengths: Sequence[int]) -> int:
        return sum(int(total_lengths[i]) for i in self.samples)


def prompt_keys(tokens: Sequence[Sequence[int]], response_lengths: Sequence[int]) -> list[tuple[int, ...]]:
    """Each sample's prompt (its tokens before the response), the key that groups samples."""
    return [tuple(t[: len(t) - int(n)]) for t, n in zip(tokens, response_lengths, strict=True)]


def balance(indices: Sequence[int], total_lengths: Sequence[int], prompts: Sequence[tuple[int, ...]],
            num_workers: int) -> list[list[int]]:
    """Split one step's sample `indices` over `num_workers` (module docstring); each list ascending."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in indices:
        groups.setdefault(prompts[i], []).append(i)
    units = list(groups.values()) if len(groups) >= num_workers else [[i] for i in indices]
    cost = [sum(int(total_lengths[i]) for i in unit) for unit in units]
    # largest first; equal costs keep the rollout's order (a stable sort on the first index)
    order = sorted(range(len(units)), key=lambda u: (-cost[u], units[u][0]))
    loads = [0] * num_workers
    out: list[list[int]] = [[] for _ in range(num_workers)]
    for u in order:
        worker = min(range(num_workers), key=lambda w: (loads[w], w))
        loads[worker] += cost[u]
        out[worker].extend(units[u])
    return [sorted(part) for part in out]


def plan_shares(steps: Sequence[Sequence[int]], total_lengths: Sequence[int], prompts: Sequence[tuple[int, ...]],
                num_workers: int) -> list[Share]:
    """One `Share` per worker for a rollout whose optimizer steps hold the sample `steps`."""
    per_step = [balance(step, total_lengths, prompts, num_workers) for step in steps]
    shares = []
    for worker in range(num_workers):
        mine = sorted(i for parts in per_step for i in parts[worker])
        position = {i: p for p, i in enumerate(mine)}
        shares.append(Share(mine, [[position[i] for i in parts[worker]] for parts in per_step]))
    return shares


def slice_train_data(train_data: dict, samples: list[int], num_samples: int) -> dict:
    """The train data of the samples `samples`: per-sample lists (one entry per sample of the
    rollout) are cut to those entries; anything else (per-rollout values) is passed as it is."""
    out = {}
    for key, value in train_data.items():
        if isinstance(value, (list, tuple)) and len(value) == num_samples:
            out[key] = [value[i] for i in samples]
        else:
            out[key] = value
    return out
