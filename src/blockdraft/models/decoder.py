"""The Llama-style decoder layer: pre-norm attention, then a SwiGLU MLP or a MoE block.

Llama, Qwen3 (per-head q/k RMSNorm: `qk_norm`), gpt-oss (sliding-window layers, attention sinks,
biases) and LFM2's attention layers run it; each family's file says which of its layers do. Attention
reads and writes the step's paged KV, or for a sliding-window layer its window kept as per-sequence state.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import TargetConfig
from ..layers.attention import attend
from ..layers.direct import DirectCall
from ..layers.linear import StableLinear
from ..layers.moe import feed_forward
from ..layers.norm import RMSNorm
from ..layers.rope import apply_rope


class TargetAttention(DirectCall):
    """Full-attention layers read and write the step's KV; sliding-window layers (gpt-oss) keep their
    last `sliding_window - 1` K/V rows as per-sequence state (`cache/state.py`) and attend over those and
    the step's own rows. `sinks`: a learned per-head logit in every softmax (gpt-oss)."""

    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.window = cfg.sliding_window if cfg.layer_type(layer) == "sliding_attention" else None
        self.sinks = nn.Parameter(torch.zeros(cfg.num_heads)) if cfg.attention_sinks else None
        self.q_proj = StableLinear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.k_proj = StableLinear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.v_proj = StableLinear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.o_proj = StableLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.attention_bias)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.qkv_proj = None          # q, k, v in one matmul when `layers/quant.py` fuses them

    def _rotated(self, x, cos, sin):
        """q [b, h, t, d], k and v [b, hkv, t, d], q and k rotated."""
        b, t, _ = x.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_proj is not None and not self.qk_norm:   # fused: q and k rotate in one pass (same bits)
            heads = self.qkv_proj(x).view(b, t, h + 2 * hkv, d).transpose(1, 2)
            qk = apply_rope(heads[:, :h + hkv], cos, sin)
            return qk[:, :h], qk[:, h:], heads[:, h + hkv:]
        if self.qkv_proj is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            q, k, v = self.qkv_proj(x).split([h * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.reshape(b, t, h, d), k.reshape(b, t, hkv, d), v.reshape(b, t, hkv, d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def forward(self, x, cos, sin, step, layer: int):
        q, k, v = self._rotated(x, cos, sin)
        if self.window is None:
            k, v = step.kv(layer, k, v)
            visible = step.visible
        else:
            k, v, visible = step.state.sliding_kv(layer, k, v, step.positions, self.window)
        return self.o_proj(attend(q, k, v, visible, self.head_dim ** -0.5, self.sinks))


class DecoderLayer(DirectCall):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        self.self_attn = TargetAttention(cfg, layer)
        self.mlp = feed_forward(cfg, layer)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, step, layer):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, step, layer)
        return x + self.mlp(self.post_attention_layernorm(x))
