"""Response log-probs with one forward pass per distinct prompt (GRPO's n samples share it).

The samples of a group start with the same prompt, and in short-answer RL the prompt is most of
each sequence (SmolLM2's chat template plus a question: ~47 tokens before a 16-token answer).
`shared_prompt_log_probs` runs the model once over the distinct prompts (right-padded, with a KV
cache), gathers each sample's prompt keys and values from that cache (`index_select`, so the
gradient of every sample flows back into its prompt's single computation) and runs only the
responses on top, at their true positions, in passes of similar response length
(`length_chunks`), so short answers are not padded to the longest one of the micro-batch. The result equals `batches.response_log_probs` up to
floating-point rounding (the same arithmetic in other batch shapes); gradients likewise.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.train.batches import model_device, pad_tokens, per_sample_log_probs

__all__ = ["PASS_OVERHEAD_TOKENS", "group_prompts", "length_chunks", "response_passes", "shared_prompt_log_probs"]


def group_prompts(tokens: list[torch.Tensor], response_lengths: list[int]) -> tuple[list[torch.Tensor], list[int]]:
    """The distinct prompts (first-seen order) and, per sample, the index of its prompt."""
    prompts: list[torch.Tensor] = []
    seen: dict[tuple[int, ...], int] = {}
    group: list[int] = []
    for t, n in zip(tokens, response_lengths, strict=True):
        prompt = t[: int(t.shape[0]) - n]
        key = tuple(prompt.tolist())
        if key not in seen:
            seen[key] = len(prompts)
            prompts.append(prompt)
        group.append(seen[key])
    return prompts, group


# one more response pass costs about as much as this many padded tokens (per-pass overhead of the
# 30 layers' calls, and smaller matmuls); measured with SmolLM2-135M on this CPU (docs/performance.md)
PASS_OVERHEAD_TOKENS = 32


def length_chunks(response_lengths: list[int], overhead: int) -> list[list[int]]:
    """Sample indices split into chunks of similar response length, each run as one response
    pass padded to its own longest: sorted by length, cut where a pass's `overhead` (in tokens)
    is less than the padding it saves (exact dynamic programme over the cut points)."""
    order = sorted(range(len(response_lengths)), key=lambda i: response_lengths[i])
    lengths = [response_lengths[i] for i in order]
    best = [0]  # best[k]: the least cost of order[:k]; cut[k]: where its last chunk starts
    cut = [0]
    for end in range(1, len(order) + 1):  # a chunk order[start:end] is padded to lengths[end - 1]
        cost, start = min((best[s] + (end - s) * lengths[end - 1] + overhead, s) for s in range(end))
        best.append(cost)
        cut.append(start)
    chunks: list[list[int]] = []
    end = len(order)
    while end > 0:
        chunks.append(order[cut[end]:end])
        end = cut[end]
    return chunks[::-1]


def response_passes(response_lengths: list[int]) -> int:
    """How many response passes (model calls after the prompt pass) `shared_prompt_log_probs`
    makes for these samples: one per length chunk whose responses are longer than one token."""
    return sum(max(response_lengths[i] for i in chunk) > 1
               for chunk in length_chunks(response_lengths, PASS_OVERHEAD_TOKENS))


def shared_prompt_log_probs(model: Any, tokens: list[torch.Tensor], response_lengths: list[int],
                            temperature: float, with_entropy: bool, autocast_dtype: torch.dtype | None = None,
                            entropy_grad: bool = True, min_passes: int = 0,
                            ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per sample: log-probs of its response tokens (float32) and optionally the entropy of the
    sampling distribution (`logits / temperature`) at each response position (with a gradient
    only when `entropy_grad`). With `min_passes` above `response_passes(response_lengths)`, the
    missing passes run as one-token passes on the first prompt whose logits enter the result
    times 0: a worker of a sharded model makes as many model calls as its peers (each call is a
    collective), and every call takes part in the backward pass."""
    from transformers import DynamicCache

    device = model_device(model)
    prompts, group = group_prompts(tokens, response_lengths)
    prompt_lengths = [int(p.shape[0]) for p in prompts]
    prompt_ids, prompt_mask = pad_tokens(prompts, device=device)
    last_positions = sorted({n - 1 for n in prompt_lengths})  # logits predicting each first response token
    responses = [t[int(t.shape[0]) - n:] for t, n in zip(tokens, response_lengths)]
    log_probs: dict[int, torch.Tensor] = {}
    entropies: dict[int, torch.Tensor] = {}
    # per response pass: its samples, their lengths, right-padded response ids, the logits of the
    # first response position and those of the others (None when every response is one token)
    passes: list[tuple[list[int], list[int], torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
    padding: list[torch.Tensor] = []  # the logits of the passes that only keep the call count
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        prompt_cache = DynamicCache()
        first_logits = model(input_ids=prompt_ids, attention_mask=prompt_mask, cache=prompt_cache,
                             logits_to_keep=torch.tensor(last_positions, device=device)
                             ).logits  # [prompts, positions, vocab]
        for chunk in length_chunks(response_lengths, PASS_OVERHEAD_TOKENS):
            rows = torch.tensor([group[i] for i in chunk], device=device)
            lengths = [response_lengths[i] for i in chunk]
            # the logits predicting each sample's first response token
            logits = first_logits[rows, torch.tensor([last_positions.index(prompt_lengths[group[i]] - 1)
                                                      for i in chunk], device=device)]  # [chunk, vocab]
            # a response's last token predicts nothing: the pass reads all but the chunk's last column
            width = max(lengths) - 1
            padded, padded_mask = pad_tokens([responses[i] for i in chunk], device=device)
            rest = None
            if width > 0:
                rest = _response_pass(model, prompt_cache, rows, prompt_mask[rows], padded[:, :width],
                                      padded_mask[:, :width], [prompt_lengths[group[i]] for i in chunk])
            passes.append((chunk, lengths, padded, logits, rest))
        for _ in range(min_passes - sum(p[4] is not None for p in passes)):
            one = torch.zeros((1, 1), dtype=torch.long, device=device)
            rows = torch.zeros(1, dtype=torch.long, device=device)
            padding.append(_response_pass(model, prompt_cache, rows, prompt_mask[rows], one, torch.ones_like(one),
                                          [prompt_lengths[0]]))
    for chunk, lengths, padded, first, rest in passes:  # outside autocast: log-probs in float32
        lps, ents = per_sample_log_probs(rest, padded, lengths, temperature, with_entropy, entropy_grad, first)
        log_probs.update(zip(chunk, lps))
        entropies.update(zip(chunk, ents or ()))
    if padding:
        log_probs[0] = log_probs[0] + 0.0 * sum(x.float().sum() for x in padding)
    order = range(len(tokens))
    return [log_probs[i] for i in order], [entropies[i] for i in order] if with_entropy else None


def _response_pass(model: Any, prompt_cache: Any, rows: torch.Tensor, prompt_mask: torch.Tensor,
                   response_ids: torch.Tensor, response_mask: torch.Tensor, starts: list[int]) -> torch.Tensor:
    """The logits [rows, width, vocab] of `response_ids` on top of the prompt cache's `rows`, at
    their true positions (prompt length + j)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for layer, kv in enumerate(prompt_cache.layers):
        cache.update(kv.keys.index_select(0, rows), kv.values.index_select(0, rows), layer)
    width = response_ids.shape[1]
    first = torch.tensor(starts, device=response_ids.device)
    return model(input_ids=response_ids, attention_mask=torch.cat([prompt_mask, response_mask], 1),
                 position_ids=first.unsqueeze(1) + torch.arange(width, device=response_ids.device),
                 cache=cache).logits
