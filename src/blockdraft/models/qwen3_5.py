"""Qwen3.5 decoder layers (transformers `qwen3_5`, `qwen3_5_moe`): hybrid Gated DeltaNet + gated attention.

Each layer is a token mixer — a Gated DeltaNet ("linear_attention", 3 of 4 layers by default) or a
gated full-attention layer — then a SwiGLU MLP or a sparse MoE block. Norm gains are `(1 + w)`.
The DeltaNet keeps per-sequence state (`cache/state.py`): its step view's `state` supplies the state
before the rows and records what rollback needs; the forward never writes it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..cache.state import LayerRecord
from ..config import TargetConfig
from ..layers.attention import attend
from ..layers.deltanet import causal_conv, delta_rule, l2_normalize
from ..layers.elementwise import lanewise
from ..layers.direct import DirectCall
from ..layers.linear import StableLinear
from ..layers.moe import feed_forward
from ..layers.norm import rms_normalized
from ..layers.rope import apply_rope


class OffsetRMSNorm(DirectCall):
    """RMSNorm with gain (1 + w), applied in fp32 before the cast back (transformers' Qwen3.5 norm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (rms_normalized(x, self.eps) * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(DirectCall):
    """The DeltaNet output norm: RMSNorm (gain w, cast back first) times SiLU(gate), per value head."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        normed = self.weight * rms_normalized(x, self.eps).to(x.dtype)
        return (normed * lanewise(F.silu, gate.float())).to(x.dtype)


class GatedDeltaNet(DirectCall):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        d = cfg.deltanet
        self.cfg = d
        self.key_dim, self.value_dim = d.num_k_heads * d.k_dim, d.num_v_heads * d.v_dim
        self.in_proj_qkv = StableLinear(cfg.hidden_size, d.conv_dim, bias=False)
        self.in_proj_z = StableLinear(cfg.hidden_size, self.value_dim, bias=False)
        self.in_proj_b = StableLinear(cfg.hidden_size, d.num_v_heads, bias=False)
        self.in_proj_a = StableLinear(cfg.hidden_size, d.num_v_heads, bias=False)
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(torch.empty(d.conv_dim, 1, d.conv_kernel))   # HF's Conv1d layout
        self.dt_bias = nn.Parameter(torch.ones(d.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(d.num_v_heads))
        self.norm = GatedRMSNorm(d.v_dim, cfg.rms_norm_eps)
        self.out_proj = StableLinear(self.value_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, state, layer: int) -> torch.Tensor:
        """x [b, t, hidden]; `state` a `StateStep` -> [b, t, hidden]."""
        b, t, _ = x.shape
        d = self.cfg
        conv_state, rec = state.initial(layer)                                   # [b, K-1, C], [b, H, dk, dv]
        mixed = self.in_proj_qkv(x)                                              # [b, t, C]
        conv = causal_conv(torch.cat([conv_state.to(mixed.dtype), mixed], 1), self.conv1d.weight[:, 0])
        q, k, v = conv.to(x.dtype).float().split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = d.num_v_heads // d.num_k_heads
        q = l2_normalize(q.reshape(b, t, d.num_k_heads, d.k_dim)).repeat_interleave(rep, dim=2) * d.k_dim ** -0.5
        k = l2_normalize(k.reshape(b, t, d.num_k_heads, d.k_dim)).repeat_interleave(rep, dim=2)
        v = v.reshape(b, t, d.num_v_heads, d.v_dim)
        beta = lanewise(torch.sigmoid, self.in_proj_b(x)).float()               # [b, t, H]
        a = self.in_proj_a(x).float() + self.dt_bias.float()
        g = -lanewise(torch.exp, self.A_log.float()) * lanewise(F.softplus, a)                # [b, t, H] log decay
        out, final, per_row = delta_rule(rec, q, k, v, g, beta, state.valid, state.keep_states)
        state.record(layer, LayerRecord(mixed, q, k, v, g, beta, final, per_row))
        z = self.in_proj_z(x).reshape(b, t, d.num_v_heads, d.v_dim)
        out = self.norm(out.to(x.dtype), z)                                      # [b, t, H, dv]
        return self.out_proj(out.reshape(b, t, self.value_dim))


class GatedAttention(DirectCall):
    """Full attention whose q_proj emits query and gate per head; q/k (1 + w) norms; rotary on the
    first `rotary_dim` dims; output × sigmoid(gate) before o_proj."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.rotary_dim = cfg.rotary_dim
        h, d = cfg.num_heads, cfg.head_dim
        self.q_proj = StableLinear(cfg.hidden_size, h * d * 2, bias=cfg.attention_bias)
        self.k_proj = StableLinear(cfg.hidden_size, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.v_proj = StableLinear(cfg.hidden_size, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.o_proj = StableLinear(h * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = OffsetRMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(d, cfg.rms_norm_eps)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = self.rotary_dim
        if r == self.head_dim:
            return apply_rope(x, cos, sin)
        return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)

    def forward(self, x, cos, sin, step, layer: int):
        b, t, _ = x.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q, gate = self.q_proj(x).view(b, t, h, 2 * d).chunk(2, dim=-1)
        q = self._rope(self.q_norm(q).transpose(1, 2), cos, sin)
        k = self._rope(self.k_norm(self.k_proj(x).view(b, t, hkv, d)).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, t, hkv, d).transpose(1, 2)
        k, v = step.kv(layer, k, v)
        out = attend(q, k, v, step.visible, d ** -0.5)                          # [b, t, h*d]
        return self.o_proj(out * lanewise(torch.sigmoid, gate.reshape(b, t, h * d)))


class HybridDecoderLayer(DirectCall):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        self.kind = cfg.layer_type(layer)
        if self.kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = GatedAttention(cfg)
        self.mlp = feed_forward(cfg, layer)
        self.input_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, step, layer):
        h = self.input_layernorm(x)
        if self.kind == "linear_attention":
            x = x + self.linear_attn(h, step.state, layer)
        else:
            x = x + self.self_attn(h, cos, sin, step, layer)
        return x + self.mlp(self.post_attention_layernorm(x))
