"""Train data -> per-sample tensors, optimizer steps and micro-batches, and response log-probs.

`TrainSamples` holds the rollout's samples in slime's per-sample form (token ids, response
lengths, loss masks, rewards and per-token log-probs as lists of 1-D tensors). Optimizer steps
take `global_batch_size` samples each (all of them when None); with `rollout_ids` (samples
sharing one are one trajectory split into several samples) `global_batch_size` rollouts each,
every sample of a rollout in the same step, as slime's dp schedule. `rollout_weights` gives each
sample its rollout's masked-token count in its step (slime's `rollout_mask_sums`: the
seq-mean-token-mean denominator) and marks one sample per rollout (the seq modes' normaliser
counts rollouts); `annotate` writes both into the train data before it is split over workers,
so a worker's share keeps the whole step's values. A step's micro-batches hold
`micro_batch_size` samples, or with `max_tokens_per_gpu` as many consecutive samples as fit in
that many padded tokens (a longer sample gets a micro-batch of its own).
`response_log_probs` runs the model on a right-padded micro-batch and returns, per sample, the
log-probs of its response tokens under `logits / temperature` (the engine's sampling
distribution) and, when asked, the entropy of that distribution at each response position.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from pipeline.train.losses import normalizer_part
from pipeline.train.token_log_probs import token_log_probs

__all__ = ["TrainSamples", "annotate", "micro_batches", "model_device", "optimizer_steps", "pad_tokens",
           "per_sample_log_probs", "response_log_probs", "rollout_weights"]


@dataclass
class TrainSamples:
    """The rollout's samples as tensors (slime's per-sample layout)."""

    tokens: list[torch.Tensor]
    response_lengths: list[int]
    loss_masks: list[torch.Tensor]
    rewards: list[float]
    rollout_log_probs: list[torch.Tensor] | None
    # slime's rollout_ids (None: every sample its own rollout) and, per sample, its rollout's
    # masked tokens in its step and 1 on one sample of each rollout (`rollout_weights`)
    rollout_ids: list[int] | None = None
    rollout_mask_sums: list[float] | None = None
    rollout_counted: list[int] | None = None

    @classmethod
    def from_train_data(cls, train_data: dict[str, Any]) -> TrainSamples:
        """Read the slime-keyed train data the pipeline produces (pipeline.stages.train_data)."""
        for key in ("tokens", "response_lengths", "loss_masks", "rewards"):
            if key not in train_data:
                raise ValueError(f"train data has no {key!r} (keys: {sorted(train_data)})")
        tokens = [torch.as_tensor(list(t), dtype=torch.long) for t in train_data["tokens"]]
        lengths = [int(n) for n in train_data["response_lengths"]]
        masks = [torch.as_tensor(list(m), dtype=torch.float32) for m in train_data["loss_masks"]]
        for i, (tok, n, mask) in enumerate(zip(tokens, lengths, masks, strict=True)):
            if not 0 < n < len(tok):
                raise ValueError(f"sample {i}: response_length {n} must be in 1..{len(tok) - 1} "
                                 f"(it has {len(tok)} tokens and needs a prompt token)")
            if mask.shape[0] != n:
                raise ValueError(f"sample {i}: loss_mask has {mask.shape[0]} entries, response_length is {n}")
        rollout = train_data.get("rollout_log_probs")
        rollout_lp = None
        if rollout is not None:
            rollout_lp = [torch.as_tensor(list(r), dtype=torch.float32) for r in rollout]
            for i, (r, n) in enumerate(zip(rollout_lp, lengths, strict=True)):
                if r.shape[0] != n:
                    raise ValueError(f"sample {i}: rollout_log_probs has {r.shape[0]} entries, "
                                     f"response_length is {n}")
        rewards = [float(r) for r in train_data["rewards"]]
        samples = cls(tokens, lengths, masks, rewards, rollout_lp)
        ids = train_data.get("rollout_ids")
        if ids is None:
            return samples
        samples.rollout_ids = [int(i) for i in ids]
        if "rollout_counted" in train_data:  # annotated for its steps (a worker's share of them)
            samples.rollout_mask_sums = [float(x) for x in train_data["rollout_mask_sums"]]
            samples.rollout_counted = [int(x) for x in train_data["rollout_counted"]]
            return samples
        return samples.for_steps([list(range(len(samples)))])

    def planned(self, global_batch_size: int | None) -> tuple[TrainSamples, list[list[int]]]:
        """The optimizer steps of these samples (`optimizer_steps`) and the samples weighed for them."""
        steps = optimizer_steps(len(self), global_batch_size, self.rollout_ids)
        return self.for_steps(steps), steps

    def normalizer_part(self, indices: list[int], loss_agg_mode: str) -> float:
        """The samples `indices`' part of their step's normaliser (`losses.normalizer_part`)."""
        counted = None if self.rollout_counted is None else [self.rollout_counted[i] for i in indices]
        return normalizer_part([self.loss_masks[i] for i in indices], loss_agg_mode, counted)

    def for_steps(self, steps: list[list[int]]) -> TrainSamples:
        """These samples weighed per rollout within each of `steps` (itself without rollout ids)."""
        if self.rollout_ids is None:
            return self
        sums, counted = rollout_weights(self.rollout_ids, [float(m.sum()) for m in self.loss_masks], steps)
        return replace(self, rollout_mask_sums=sums, rollout_counted=counted)

    def __len__(self) -> int:
        return len(self.tokens)

    def to(self, device: torch.device | str) -> TrainSamples:
        """The same samples with their tensors on `device` (itself when they are there)."""
        device = torch.device(device)
        if device.type == "cpu":
            return self
        move = lambda xs: [x.to(device) for x in xs]  # noqa: E731
        return replace(self, tokens=move(self.tokens), loss_masks=move(self.loss_masks),
                       rollout_log_probs=None if self.rollout_log_probs is None else move(self.rollout_log_probs))

    @property
    def total_lengths(self) -> list[int]:
        return [int(t.shape[0]) for t in self.tokens]

    def num_tokens(self) -> int:
        return sum(self.total_lengths)


def optimizer_steps(n_samples: int, global_batch_size: int | None,
                    rollout_ids: list[int] | None = None) -> list[list[int]]:
    """Sample indices per optimizer step, ascending: `global_batch_size` samples each, or with
    `rollout_ids` that many rollouts (in the order they first appear) with all their samples."""
    if rollout_ids is None:
        size = n_samples if not global_batch_size else int(global_batch_size)
        return [list(range(i, min(i + size, n_samples))) for i in range(0, n_samples, max(size, 1))]
    rollouts: dict[int, list[int]] = {}
    for i, rid in enumerate(rollout_ids[:n_samples]):
        rollouts.setdefault(int(rid), []).append(i)
    groups = list(rollouts.values())
    size = len(groups) if not global_batch_size else int(global_batch_size)
    return [sorted(i for group in groups[k:k + size] for i in group) for k in range(0, len(groups), max(size, 1))]


def rollout_weights(rollout_ids: list[int], mask_totals: list[float],
                    steps: list[list[int]]) -> tuple[list[float], list[int]]:
    """Per sample: the masked tokens of its rollout's samples in its step, and 1 on the first
    sample of each rollout in a step (else 0). A sample in no step keeps its own count and 1."""
    sums = [float(m) for m in mask_totals]
    counted = [1] * len(mask_totals)
    for step in steps:
        rollouts: dict[int, list[int]] = {}
        for i in step:
            rollouts.setdefault(int(rollout_ids[i]), []).append(i)
        for members in rollouts.values():
            total = float(sum(mask_totals[i] for i in members))
            for k, i in enumerate(members):
                sums[i], counted[i] = total, int(k == 0)
    return sums, counted


def annotate(train_data: dict[str, Any], steps: list[list[int]]) -> dict[str, Any]:
    """A copy of `train_data` with `rollout_weights` as its per-sample `rollout_mask_sums` and
    `rollout_counted` (`train_data` itself when it has no `rollout_ids`)."""
    if train_data.get("rollout_ids") is None:
        return train_data
    totals = [float(sum(m)) for m in train_data["loss_masks"]]
    sums, counted = rollout_weights(list(train_data["rollout_ids"]), totals, steps)
    return {**train_data, "rollout_mask_sums": sums, "rollout_counted": counted}


def micro_batches(indices: list[int], total_lengths: list[int], micro_batch_size: int,
                  max_tokens_per_gpu: int | None) -> list[list[int]]:
    """Split one step's samples into micro-batches: by count, or by padded tokens (n x longest)."""
    if not max_tokens_per_gpu:
        size = max(int(micro_batch_size), 1)
        return [indices[i:i + size] for i in range(0, len(indices), size)]
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in indices:
        grown = max(longest, total_lengths[i])
        if current and grown * (len(current) + 1) > max_tokens_per_gpu:
            out.append(current)
            current, grown = [], total_lengths[i]
        current.append(i)
        longest = grown
    if current:
        out.append(current)
    return out


def pad_tokens(tokens: list[torch.Tensor], pad_id: int = 0,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T] and attention mask [B, T], on `device` (None: the tokens' own)."""
    width = max(int(t.shape[0]) for t in tokens)
    device = tokens[0].device if device is None else device
    ids = torch.full((len(tokens), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(tokens), width), dtype=torch.long, device=device)
    for row, t in enumerate(tokens):
        ids[row, : t.shape[0]] = t
        mask[row, : t.shape[0]] = 1
    return ids, mask


def model_device(model: Any) -> torch.device:
    """The device `model` computes on: its first parameter's (a sharded one's local shard's);
    the CPU for a model without parameters."""
    params = getattr(model, "parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    return torch.device("cpu") if first is None else first.device


def response_log_probs(model: Any, tokens: list[torch.Tensor], response_lengths: list[int],
                       temperature: float, with_entropy: bool, autocast_dtype: torch.dtype | None = None,
                       entropy_grad: bool = True) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per sample: log-probs of its response tokens (float32) and optionally the entropy (with a
    gradient only when `entropy_grad`)."""
    device = model_device(model)
    ids, attention = pad_tokens(tokens, device=device)
    width = ids.shape[1]
    first_logit = min(int(t.shape[0]) - n - 1 for t, n in zip(tokens, response_lengths))
    keep = width - first_logit  # logits of positions first_logit .. width - 1
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=keep, use_cache=False).logits
    # row r's response starts at column starts[r] of `logits`: only those positions are scored
    # (no aligned copy of the [B, keep, V] logits)
    starts = [int(t.shape[0]) - n - 1 - first_logit for t, n in zip(tokens, response_lengths)]
    targets = pad_tokens([t[int(t.shape[0]) - n:] for t, n in zip(tokens, response_lengths)], device=device)[0]
    return per_sample_log_probs(logits, targets, response_lengths, temperature, with_entropy, entropy_grad,
                                starts=starts)


def per_sample_log_probs(logits: torch.Tensor | None, targets: torch.Tensor, response_lengths: list[int],
                         temperature: float, with_entropy: bool, entropy_grad: bool,
                         first_logits: torch.Tensor | None = None, starts: list[int] | None = None,
                         ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Log-probs of `targets` [B, N] under `logits / temperature` ([B, W, V], column starts[r] + j
    of row r predicting its target j; `starts` None: all 0; rows right-padded) and the
    entropies. With `first_logits` [B, V], position 0 of every row comes from it and `logits`
    ([B, N - 1, V], or None when N is 1) holds positions 1 on (no concatenated copy of the two).
    Only the response positions (not the padding) go through `token_log_probs`; the results are
    cut per row."""
    offset = 0 if first_logits is None else 1
    if starts is None:
        starts = [0] * len(response_lengths)
    parts: list[tuple[torch.Tensor, torch.Tensor]] = []  # (log-probs, entropies) of each source
    if first_logits is not None:
        parts.append(token_log_probs(first_logits, targets[:, 0], temperature))
    if logits is not None:
        rows, width = logits.shape[:2]
        positions = torch.cat([torch.arange(max(n - offset, 0), device=logits.device) + start + row * width
                               for row, (n, start) in enumerate(zip(response_lengths, starts))])
        wanted = torch.cat([targets[row, offset:n] for row, n in enumerate(response_lengths)])
        parts.append(token_log_probs(logits.reshape(rows * width, logits.shape[-1]), wanted, temperature, positions))
    log_probs = _per_row([p[0] for p in parts], response_lengths, offset)
    if not with_entropy:
        return log_probs, None
    entropy = _per_row([p[1] if entropy_grad else p[1].detach() for p in parts], response_lengths, offset)
    return log_probs, entropy


def _per_row(sources: list[torch.Tensor], response_lengths: list[int], offset: int) -> list[torch.Tensor]:
    """Per row: its value from the first-position source (when `offset` is 1) followed by its
    segment of the other source."""
    if offset == 0:  # no first-position source: `logits` was given (every row has a response)
        return list(sources[0].split(response_lengths))
    first = sources[0]
    if len(sources) == 1:
        return [first[row:row + 1] for row in range(len(response_lengths))]
    rest = sources[1].split([n - 1 for n in response_lengths])
    return [torch.cat([first[row:row + 1], rest[row]]) for row in range(len(response_lengths))]
