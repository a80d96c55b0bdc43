"""A lean one-token decode step for Llama-family transformers models over a static KV cache.

`LeanDecoder` takes the weights of a loaded `transformers` model (no copies except the fused
projections) and runs one decode step for a batch with plain torch ops: per layer one fused q/k/v
matmul, RoPE from a precomputed table, the new key/value written into a pre-allocated cache,
grouped-query attention as one SDPA call over the live cache columns (the query heads of a
key/value head are its queries: no copies, no head repetition), one fused gate/up matmul. That is
4 matmuls and about 20 small ops per layer instead of the generic module stack with its per-step
mask building and `DynamicCache` concatenation. The arithmetic is the same as the transformers
implementation (RMSNorm in float32, the same RoPE values); only the rounding of reordered sums
differs.

The per-layer work is one module-level function (`decode_layer`) that takes the layer's
weights as arguments, so `torch.compile` (`compile=True`) traces it once and reuses the compiled
code for all layers (compiling the whole 30-layer step instead took 7+ minutes here). The weights
stay graph inputs, not constants: `refresh()` copies changed model weights into the fused
tensors in place, and the next step, compiled or not, uses them.

`packed=True` (uncompiled, weights on the CPU; float32, or bfloat16 where oneDNN has bfloat16 kernels) runs those
matmuls and the output head through oneDNN with the weights reordered once into its blocked
layout (`torch.ops.mkldnn._linear_pointwise`, what inductor uses for frozen CPU linears) instead
of `aten::linear`, which re-packs each weight on every call: at decode batch sizes the step reads
every weight once and does little arithmetic with it, and skipping the re-pack made a step
1.15-1.5x faster on an AVX2 CPU in float32 and its matmuls 1.36x faster in bfloat16 on an AMX
CPU, with results bit-identical to `aten::linear`'s (docs/performance.md). `refresh()` reorders
the changed weights again.

`native=` (a `native_kernels.NativeKernels`; bfloat16, packed) runs each layer's work between its
four matmuls in three fused C calls instead of the PyTorch ops of `decode_layer`: the residual add
with the RMSNorm, RoPE with the cache write and the attention, SiLU times up (`_native_step`;
what it rounds differently: `pipeline/engines/native_kernels.py`). `native_problem` says when a
decoder cannot use them.

The decoder runs where the model's weights are (`device`: the CPU, or a GPU): its RoPE table and
caches are made there, and a step's inputs must be there too. The packed matmuls and the native
kernels are CPU-only: a model on a GPU runs the plain PyTorch ops of `decode_layer`.

Supported: decoder-only models with the Llama layer layout (`model.model.layers[i].self_attn.
{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`, RMSNorms, SiLU, full attention, optional q/k/v bias
as in Qwen2, optional q/k norms as in Qwen3). `supports(model)` says whether a model qualifies.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from pipeline.engines.native_kernels import NativeKernels
from pipeline.process.precision import fast_bfloat16

__all__ = ["LeanDecoder", "native_problem", "packable_dtype", "packed_matmuls_available", "supports"]

logger = logging.getLogger(__name__)


def packed_matmuls_available() -> bool:
    """Whether this torch build has oneDNN's pre-packed linear (`LeanDecoder(packed=True)`)."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise") and hasattr(
        ops, "_reorder_linear_weight")


def packable_dtype(dtype: torch.dtype) -> bool:
    """Whether `LeanDecoder(packed=True)` packs weights of `dtype`: float32 always, bfloat16 where
    oneDNN has bfloat16 kernels for this CPU (elsewhere its bfloat16 path is a slow reference)."""
    return dtype == torch.float32 or (dtype == torch.bfloat16 and fast_bfloat16())


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

    def __init__(self, model: Any, compile: bool = False, packed: bool = False,
                 native: NativeKernels | None = None) -> None:
        reason = supports(model)
        if reason is not None:
            raise ValueError(f"the static decode path cannot run this model: {reason}")
        inner = model.model
        cfg = model.config
        first = inner.layers[0].self_attn
        self.dtype = inner.embed_tokens.weight.dtype
        # where the weights are: the caches, tables and step inputs are made there too
        self.device = inner.embed_tokens.weight.device
        self.num_layers = len(inner.layers)
        self.head_dim = int(getattr(first, "head_dim", cfg.hidden_size // cfg.num_attention_heads))
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.scaling = float(getattr(first, "scaling", self.head_dim ** -0.5))
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm
        self.lm_head = model.lm_head.weight
        self._source_layers = inner.layers
        # oneDNN's blocked copies of the matmul weights (uncompiled only); see module doc
        self.packed = (packed and not compile and self.device.type == "cpu" and packable_dtype(self.dtype)
                       and packed_matmuls_available())
        # packed: no fused q/k/v and gate/up copies (the blocked ones replace them; `_pack`)
        self.layers = [self._fuse(layer, matmuls=not self.packed) for layer in inner.layers]
        self._packed_layers: list[dict[str, torch.Tensor]] = []
        self._packed_lm_head: torch.Tensor | None = None
        if self.packed:
            self._pack()
        positions = int(getattr(cfg, "max_position_embeddings", 8192))
        with torch.inference_mode():
            probe = torch.zeros(1, dtype=self.dtype, device=self.device)
            cos, sin = inner.rotary_emb(probe, torch.arange(positions, device=self.device).unsqueeze(0))
        self.cos, self.sin = cos[0], sin[0]  # [positions, head_dim], the transformers values
        self.compiled = compile
        # the fused C kernels between the matmuls (bfloat16, packed, Llama layout only)
        self.native: NativeKernels | None = None
        if native is not None:
            self.use_native(native)
        # one compiled graph for every layer; shapes (rows, live columns) are symbolic
        self._layer = torch.compile(decode_layer, dynamic=True) if compile else decode_layer

    def use_native(self, kernels: NativeKernels) -> str | None:
        """Run the steps' work between the matmuls on `kernels` (`native_kernels`); returns why
        not (and keeps the PyTorch ops) when this decoder cannot, else None."""
        reason = native_problem(self)
        self.native = kernels if reason is None else None
        return reason

    def _fuse(self, layer: Any, matmuls: bool = True) -> dict[str, Any]:
        """A layer's weights for `decode_layer`; `matmuls=False` leaves out the fused q/k/v and
        gate/up matmul weights (None)."""
        attn, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach() if matmuls else None
        bias = None
        if attn.q_proj.bias is not None:
            bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).detach()
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        return {
            "in_norm": layer.input_layernorm.weight, "post_norm": layer.post_attention_layernorm.weight,
            "eps": float(layer.input_layernorm.variance_epsilon),
            "qkv": qkv, "qkv_bias": bias, "o": attn.o_proj.weight,
            "q_norm": None if q_norm is None else q_norm.weight,
            "k_norm": None if k_norm is None else k_norm.weight,
            "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach() if matmuls else None,
            "down": mlp.down_proj.weight,
        }

    def _pack(self) -> None:
        """(Re)build the oneDNN-blocked weights from the model's current weights, layer by
        layer (a refresh holds one layer's old blocked copy extra at a time, not the whole
        model's); the layers keep no fused q/k/v and gate/up copies (one extra copy of the
        weights, not two). The fused q/k/v bias is rebuilt too. Callers hold off decode steps
        meanwhile (the engine's step lock)."""
        reorder = torch.ops.mkldnn._reorder_linear_weight
        with torch.no_grad():
            for i, (w, layer) in enumerate(zip(self.layers, self._source_layers)):
                fresh = self._fuse(layer)
                blocked = {key: reorder(fresh[key]) for key in _MATMULS}
                if i < len(self._packed_layers):
                    self._packed_layers[i] = blocked
                else:
                    self._packed_layers.append(blocked)
                w["qkv_bias"] = fresh["qkv_bias"]
            self._packed_lm_head = None  # the old head goes before the new one is made
            self._packed_lm_head = reorder(self.lm_head.detach())

    def refresh(self) -> None:
        """Copy the model's current weights into the fused q/k/v and gate/up tensors in place
        (after the model's weights changed in place); the other weights are the model's own
        tensors. The tensors keep their identity, so a compiled step needs no recompile. With
        packed matmuls, the blocked weights are rebuilt instead."""
        if self.packed:
            self._pack()
            return
        with torch.no_grad():
            for fused, layer in zip(self.layers, self._source_layers):
                new = self._fuse(layer)
                for key in ("qkv", "qkv_bias", "gate_up"):
                    if fused[key] is not None:
                        fused[key].copy_(new[key])

    def new_cache(self, rows: int, columns: int) -> torch.Tensor:
        """An empty key+value cache [2, layers, rows, kv_heads, columns, head_dim]."""
        return torch.zeros((2, self.num_layers, rows, self.num_kv_heads, columns, self.head_dim),
                           dtype=self.dtype, device=self.device)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor,
             column: int, start: int, bias: torch.Tensor) -> torch.Tensor:
        """One decode step for rows 0..B-1 of `cache`.

        tokens, positions: [B] long (the token fed and its position); the new keys/values are
        written at `column`; attention reads columns `start..column` with `bias` [B, 1, 1,
        column + 1 - start] added to the scores (0 for real tokens, -inf for padding).
        Returns float32 logits [B, V].
        """
        if self.native is not None:
            return self._native_step(tokens, positions, cache, column, start, bias)
        rows = tokens.shape[0]
        dim = self.head_dim
        cos = self.cos[positions].view(rows, 1, 1, dim)
        sin = self.sin[positions].view(rows, 1, 1, dim)
        x = self.embed[tokens]  # [B, hidden]
        for i, w in enumerate(self.layers):
            m = self._packed_layers[i] if self.packed else w
            x = self._layer(x, cos, sin, cache[0, i, :rows], cache[1, i, :rows], column, start, bias,
                            w["in_norm"], w["post_norm"], w["eps"], m["qkv"], w["qkv_bias"],
                            w["q_norm"], w["k_norm"], m["o"], m["gate_up"], m["down"],
                            self.num_heads, self.num_kv_heads, self.scaling,
                            packed_linear if self.packed else torch.nn.functional.linear)
        x = self.norm(x)
        if self.packed:
            return packed_linear(x, self._packed_lm_head).float()
        return torch.nn.functional.linear(x, self.lm_head).float()

    def _native_step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor,
                     column: int, start: int, bias: torch.Tensor) -> torch.Tensor:
        """`step` with the work between the matmuls in the native kernels (same contract)."""
        kernels = self.native
        assert kernels is not None
        rows = tokens.shape[0]
        cos, sin = self.cos[positions], self.sin[positions]  # [B, dim], contiguous
        bias = bias.reshape(rows, -1)
        x = self.embed[tokens]  # [B, hidden], a new tensor: the residual stream, updated in place
        h = torch.empty_like(x)
        attn = torch.empty((rows, self.num_heads * self.head_dim), dtype=self.dtype, device=self.device)
        # SiLU(gate) * up
        act = torch.empty((rows, self.layers[0]["down"].shape[1]), dtype=self.dtype, device=self.device)
        delta: torch.Tensor | None = None
        for i, w in enumerate(self.layers):
            m = self._packed_layers[i]
            kernels.add_rms_norm(x, delta, w["in_norm"], h, w["eps"])
            qkv = packed_linear(h, m["qkv"])
            kernels.rope_attention(qkv, cos, sin, cache[0, i], cache[1, i], bias, attn, self.num_heads,
                                   column, start, self.scaling)
            kernels.add_rms_norm(x, packed_linear(attn, m["o"]), w["post_norm"], h, w["eps"])
            kernels.silu_mul(packed_linear(h, m["gate_up"]), act)
            delta = packed_linear(act, m["down"])
        kernels.add_rms_norm(x, delta, self.norm.weight, h, float(self.norm.variance_epsilon))
        return packed_linear(h, self._packed_lm_head).float()


def native_problem(decoder: LeanDecoder) -> str | None:
    """None when `decoder` can run its steps on the native kernels, else why not."""
    if decoder.device.type != "cpu":
        return f"they are CPU kernels and the model is on {decoder.device}"
    if decoder.dtype != torch.bfloat16:
        return f"they are bfloat16 kernels and the engine runs {str(decoder.dtype).removeprefix('torch.')}"
    if not decoder.packed:
        return "they need the oneDNN-packed matmuls (packed_matmuls=true, compile_decode=false)"
    first = decoder.layers[0]
    if first["qkv_bias"] is not None or first["q_norm"] is not None:
        return "the model has q/k/v biases or q/k norms"
    hidden, inter = int(decoder.embed.shape[1]), int(first["down"].shape[1])
    if decoder.head_dim % 32 or decoder.head_dim > 128 or hidden % 16 or inter % 16:
        return (f"head_dim {decoder.head_dim} (needs a multiple of 32 up to 128), hidden {hidden} and "
                f"intermediate size {inter} (need multiples of 16)")
    if decoder.num_heads % decoder.num_kv_heads or decoder.num_heads // decoder.num_kv_heads > 8:
        return f"{decoder.num_heads} query heads over {decoder.num_kv_heads} key/value heads (up to 8 per key/value head)"
    return None


def decode_layer(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, column: int, start: int, bias: torch.Tensor,
                 in_norm: torch.Tensor, post_norm: torch.Tensor, eps: float, qkv_w: torch.Tensor,
                 qkv_bias: torch.Tensor | None, q_norm: torch.Tensor | None,
                 k_norm: torch.Tensor | None, o_w: torch.Tensor, gate_up_w: torch.Tensor,
                 down_w: torch.Tensor, heads: int, kv_heads: int, scaling: float,
                 linear: Callable[..., torch.Tensor] = torch.nn.functional.linear) -> torch.Tensor:
    """One Llama-family layer for one new token per row (see `LeanDecoder.step`); writes the
    row's key/value at `column` of `keys` / `values` [B, kv_heads, columns, head_dim].
    `linear(x, weight, bias)`: `aten::linear`, or `packed_linear` for oneDNN-blocked weights."""
    rows, dim = x.shape[0], keys.shape[-1]
    group = heads // kv_heads
    h = rms_norm(x, in_norm, eps)
    qkv = linear(h, qkv_w, qkv_bias)
    q = qkv[:, : heads * dim].view(rows, kv_heads, group, dim)
    k = qkv[:, heads * dim: (heads + kv_heads) * dim].view(rows, kv_heads, 1, dim)
    v = qkv[:, (heads + kv_heads) * dim:].view(rows, kv_heads, 1, dim)
    if q_norm is not None and k_norm is not None:
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    keys[:, :, column: column + 1] = k
    values[:, :, column: column + 1] = v
    # grouped-query attention with the G query heads of a key/value head as G queries: one
    # fused SDPA call over the live columns, no head repetition, no copy of the cache slice
    attn = torch.nn.functional.scaled_dot_product_attention(
        q, keys[:, :, start: column + 1], values[:, :, start: column + 1], attn_mask=bias,
        scale=scaling).reshape(rows, heads * dim)
    x = x + linear(attn, o_w)
    h = rms_norm(x, post_norm, eps)
    gate, up = linear(h, gate_up_w).chunk(2, dim=-1)
    return x + linear(torch.nn.functional.silu(gate) * up, down_w)


# the weights `LeanDecoder(packed=True)` keeps in oneDNN's blocked layout (and the output head)
_MATMULS = ("qkv", "o", "gate_up", "down")


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` for a weight from `torch.ops.mkldnn._reorder_linear_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Llama / Qwen RMSNorm, op for op as transformers computes it (float32 inside)."""
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return weight * (hidden * torch.rsqrt(variance + eps)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
