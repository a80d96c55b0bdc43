"""Response log-probs with one forward pass per distinct prompt (GRPO's n samples share it).

The samples of a group start with the same prompt, and in short-answer RL the prompt is most of
each sequence (SmolLM2's chat template plus a question: ~47 tokens before a 16-token answer).
`shared_prompt_log_probs` runs the model once over the distinct prompts (right-padded, with a KV
cache), gathers each sample's prompt keys and values from that cache (`index_select`, so the
gradient of every sample flows back into its prompt's single computation) and runs only the
responses on top, at their true positions. The result equals `batches.response_log_probs` up to
floating-point rounding (the same arithmetic in other batch shapes); gradients likewise.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.train.batches import pad_tokens

__all__ = ["group_prompts", "shared_prompt_log_probs"]


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


def shared_prompt_log_probs(model: Any, tokens: list[torch.Tensor], response_lengths: list[int],
                            temperature: float, with_entropy: bool, autocast_dtype: torch.dtype | None = None,
                            ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per sample: log-probs of its response tokens (float32) and optionally the entropy of the
    sampling distribution (`logits / temperature`) at each response position."""
    from transformers import DynamicCache

    prompts, group = group_prompts(tokens, response_lengths)
    prompt_lengths = [int(p.shape[0]) for p in prompts]
    prompt_ids, prompt_mask = pad_tokens(prompts)
    last_positions = sorted({n - 1 for n in prompt_lengths})  # logits predicting each first response token
    responses = [t[int(t.shape[0]) - n:] for t, n in zip(tokens, response_lengths)]
    # a response's last token predicts nothing: the response pass reads all but the last column
    width = max(response_lengths) - 1
    with torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype is not None):
        prompt_cache = DynamicCache()
        first_logits = model(input_ids=prompt_ids, attention_mask=prompt_mask, cache=prompt_cache, use_cache=True,
                             logits_to_keep=torch.tensor(last_positions)).logits  # [prompts, positions, vocab]
        rest_logits = None
        if width > 0:
            rows = torch.tensor(group)
            cache = DynamicCache()
            for layer, kv in enumerate(prompt_cache.layers):
                cache.update(kv.keys.index_select(0, rows), kv.values.index_select(0, rows), layer)
            response_ids, response_mask = (x[:, :width] for x in pad_tokens(responses))
            starts = torch.tensor([prompt_lengths[g] for g in group])
            rest_logits = model(input_ids=response_ids, attention_mask=torch.cat([prompt_mask[rows], response_mask], 1),
                                position_ids=starts.unsqueeze(1) + torch.arange(width), cache=cache,
                                use_cache=True).logits  # [samples, width, vocab]
    log_probs: list[torch.Tensor] = []
    entropies: list[torch.Tensor] | None = [] if with_entropy else None
    for i, (response, n) in enumerate(zip(responses, response_lengths)):
        first = first_logits[group[i], last_positions.index(prompt_lengths[group[i]] - 1)].unsqueeze(0)
        logits = first if n == 1 else torch.cat([first, rest_logits[i, : n - 1]])  # type: ignore[index]
        scaled = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if temperature != 1.0:
            scaled = scaled / temperature
        logp_all = torch.log_softmax(scaled, dim=-1)
        log_probs.append(logp_all.gather(-1, response.unsqueeze(-1)).squeeze(-1))
        if entropies is not None:
            entropies.append(-(logp_all.exp() * logp_all).sum(-1))
    return log_probs, entropies
