"""A lean one-token decode step for Llama-family transformers models over a static KV cache.

`LeanDecoder` takes the weights of a loaded `transformers` model (no copies except the fused
projections) and runs one decode step for a batch with plain torch ops: per layer one fused
q/k/v matmul, RoPE from a precomputed table, the new key/value written into a pre-allocated
cache, grouped-query attention as two batched matmuls over the live cache columns (no copies,
no head repetition), one fused gate/up matmul. That is 4 matmuls and about 20 small ops per
layer instead of the generic module stack with its per-step mask building and `DynamicCache`
concatenation. The arithmetic is the same as the transformers implementation (RMSNorm in float32,
the same RoPE values); only the rounding of reordered sums differs.

Supported: decoder-only models with the Llama layer layout (`model.model.layers[i].self_attn.
{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`, RMSNorms, SiLU, full attention, optional q/k/v bias
as in Qwen2, optional q/k norms as in Qwen3). `supports(model)` says whether a model qualifies.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["LeanDecoder", "supports"]

logger = logging.getLogger(__name__)


def supports(model: Any) -> str | None:
    """None if `LeanDecoder` can run `model`, else the reason it cannot."""
    cfg = model.config
    inner = getattr(model, "model", None)
    if getattr(cfg, "model_type", None) not in ("llama", "mistral", "qwen2", "qwen3"):
        return f"model_type {getattr(cfg, 'model_type', None)!r} is not Llama-family"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (only silu)"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "sliding-window attention"
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(inner, "layers"):
        return "no model.model.layers / rotary_emb"
    return None


class LeanDecoder:
    """Runs decode steps of `model` against caller-owned key/value caches (see module doc)."""

    def __init__(self, model: Any) -> None:
        reason = supports(model)
        if reason is not None:
            raise ValueError(f"the static decode path cannot run this model: {reason}")
        inner = model.model
        cfg = model.config
        first = inner.layers[0].self_attn
        self.dtype = inner.embed_tokens.weight.dtype
        self.num_layers = len(inner.layers)
        self.head_dim = int(getattr(first, "head_dim", cfg.hidden_size // cfg.num_attention_heads))
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.scaling = float(getattr(first, "scaling", self.head_dim ** -0.5))
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm
        self.lm_head = model.lm_head.weight
        self._source_layers = inner.layers
        self.layers = [self._fuse(layer) for layer in inner.layers]
        positions = int(getattr(cfg, "max_position_embeddings", 8192))
        with torch.inference_mode():
            probe = torch.zeros(1, dtype=self.dtype)
            cos, sin = inner.rotary_emb(probe, torch.arange(positions).unsqueeze(0))
        self.cos, self.sin = cos[0], sin[0]  # [positions, head_dim], the transformers values

    def _fuse(self, layer: Any) -> dict[str, Any]:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
        bias = None
        if attn.q_proj.bias is not None:
            bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).detach()
        return {
            "in_norm": layer.input_layernorm, "post_norm": layer.post_attention_layernorm,
            "qkv": qkv, "qkv_bias": bias, "o": attn.o_proj.weight,
            "q_norm": getattr(attn, "q_norm", None), "k_norm": getattr(attn, "k_norm", None),
            "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(),
            "down": mlp.down_proj.weight,
        }

    def refresh(self) -> None:
        """Rebuild the fused copies (q/k/v, gate/up) after the model's weights changed in place;
        the other weights are the model's own tensors and need nothing."""
        self.layers = [self._fuse(layer) for layer in self._source_layers]

    def new_cache(self, rows: int, columns: int) -> torch.Tensor:
        """An empty key+value cache [2, layers, rows, kv_heads, columns, head_dim]."""
        return torch.zeros((2, self.num_layers, rows, self.num_kv_heads, columns, self.head_dim),
                           dtype=self.dtype)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor,
             column: int, start: int, bias: torch.Tensor) -> torch.Tensor:
        """One decode step for rows 0..B-1 of `cache`.

        tokens, positions: [B] long (the token fed and its position); the new keys/values are
        written at `column`; attention reads columns `start..column` with `bias` [B, 1, 1,
        column + 1 - start] added to the scores (0 for real tokens, -inf for padding).
        Returns float32 logits [B, V].
        """
        rows = tokens.shape[0]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        group = heads // kv_heads
        cos = self.cos[positions].view(rows, 1, 1, dim)
        sin = self.sin[positions].view(rows, 1, 1, dim)
        x = self.embed[tokens]  # [B, hidden]
        for i, w in enumerate(self.layers):
            h = w["in_norm"](x)
            qkv = torch.nn.functional.linear(h, w["qkv"], w["qkv_bias"])
            q = qkv[:, : heads * dim].view(rows, kv_heads, group, dim)
            k = qkv[:, heads * dim: (heads + kv_heads) * dim].view(rows, kv_heads, 1, dim)
            v = qkv[:, (heads + kv_heads) * dim:].view(rows, kv_heads, 1, dim)
            if w["q_norm"] is not None:
                q, k = w["q_norm"](q), w["k_norm"](k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = cache[0, i, :rows], cache[1, i, :rows]
            keys[:, :, column: column + 1] = k
            values[:, :, column: column + 1] = v
            live_k = keys[:, :, start: column + 1]
            live_v = values[:, :, start: column + 1]
            scores = torch.matmul(q, live_k.transpose(-1, -2)) * self.scaling + bias  # [B,KV,G,L]
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
            attn = torch.matmul(probs, live_v).reshape(rows, heads * dim)
            x = x + torch.nn.functional.linear(attn, w["o"])
            h = w["post_norm"](x)
            gate, up = torch.nn.functional.linear(h, w["gate_up"]).chunk(2, dim=-1)
            x = x + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w["down"])
        x = self.norm(x)
        return torch.nn.functional.linear(x, self.lm_head).float()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
