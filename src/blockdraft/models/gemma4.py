"""Gemma 4 decoder layers (transformers `gemma4`, `gemma4_text`).

A layer: sandwich-normed attention, then a GeGLU MLP — beside it, in the MoE variant, routed experts
whose sum joins the MLP's before the post-feed-forward norm — then, where configured, the per-layer
embedding branch, and last the whole residual scaled by the checkpoint's `layer_scalar`.

Attention: q/k RMSNorm (plain gains) and a gain-less norm on V, scaling 1.0. Sliding layers (5 of 6)
use the model's head geometry and default RoPE, and keep their last W-1 K/V rows as per-sequence state
(`StateStep.sliding_kv`, as gpt-oss's); full layers may have their own head size and KV heads
(`global_head_dim`, `num_global_key_value_heads`), proportional RoPE, and V = the raw K projection
(`attention_k_eq_v`). The last `num_kv_shared_layers` layers compute only queries and attend with the
K/V (and mask) of the last earlier layer of their type, handed over within the forward (`Gemma4Step`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import TargetConfig
from ..layers.attention import attend
from ..layers.direct import DirectCall
from ..layers.elementwise import lanewise
from ..layers.linear import StableLinear, stable_linear
from ..layers.mlp import MLP, gelu_tanh
from ..layers.moe import Experts, Router, mix_experts
from ..layers.norm import RMSNorm, rms_normalized
from ..layers.rope import Rotary, apply_rope


class Gemma4Attention(DirectCall):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        self.kind = cfg.layer_type(layer)
        self.num_heads = cfg.num_heads
        self.num_kv_heads, self.head_dim = cfg.kv_geometry(layer)
        self.window = cfg.sliding_window if self.kind == "sliding_attention" else None
        self.source = cfg.kv_source(layer)
        self.eps = cfg.rms_norm_eps
        h, d = cfg.hidden_size, self.head_dim
        bias = cfg.attention_bias
        self.q_proj = StableLinear(h, self.num_heads * d, bias=bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.o_proj = StableLinear(self.num_heads * d, h, bias=bias)
        self.k_proj = self.v_proj = self.k_norm = None
        if self.source == layer:
            self.k_proj = StableLinear(h, self.num_kv_heads * d, bias=bias)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
            if not (cfg.attention_k_eq_v and self.kind == "full_attention"):
                self.v_proj = StableLinear(h, self.num_kv_heads * d, bias=bias)

    def forward(self, x, cos, sin, step, layer: int):
        b, t, _ = x.shape
        cos, sin = cos[self.kind], sin[self.kind]
        q = apply_rope(self.q_norm(self.q_proj(x).view(b, t, self.num_heads, self.head_dim)).transpose(1, 2), cos, sin)
        if self.source != layer:
            k, v, visible = step.shared_kv[self.source]
        else:
            shape = (b, t, self.num_kv_heads, self.head_dim)
            raw = self.k_proj(x).view(shape)
            k = apply_rope(self.k_norm(raw).transpose(1, 2), cos, sin)                  # [b, hkv, t, d]
            v_raw = raw if self.v_proj is None else self.v_proj(x).view(shape)
            v = rms_normalized(v_raw, self.eps).to(x.dtype).transpose(1, 2)
            if self.window is None:
                k, v = step.kv(layer, k, v)
                visible = step.visible
            else:
                k, v, visible = step.state.sliding_kv(layer, k, v, step.positions, self.window)
            step.shared_kv[layer] = (k, v, visible)
        return self.o_proj(attend(q, k, v, visible, 1.0))


class Gemma4Router(nn.Module):
    """softmax(proj(norm(h) · scale · H^-1/2)) over all experts in fp32, the top-k renormalised and
    multiplied by their `per_expert_scale`. Reads the residual stream itself, not a normed input. The
    projection is a bare weight, so weight-only quantization leaves it (and the routing) in bf16."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        m = cfg.moe
        self.top_k, self.eps, self.root = m.top_k, cfg.rms_norm_eps, cfg.hidden_size ** -0.5
        self.proj = Router(cfg.hidden_size, m.num_experts)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(m.num_experts))

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """flat [n, H] -> (weights [n, k] fp32, expert ids [n, k])."""
        normed = rms_normalized(flat, self.eps).to(flat.dtype) * self.scale * self.root
        probs = torch.softmax(stable_linear(normed, self.proj.weight), dim=-1, dtype=torch.float32)   # [n, E]
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[ids], ids


class Gemma4Layer(DirectCall):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.cfg = cfg
        self.self_attn = Gemma4Attention(cfg, layer)
        wide = 2 if cfg.double_wide_mlp and cfg.kv_shared_layers and cfg.kv_shared(layer) else 1
        self.mlp = MLP(h, cfg.intermediate_size * wide, act="gelu_tanh")
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, RMSNorm(h, eps))
        if cfg.moe is not None:
            self.router = Gemma4Router(cfg)
            self.experts = Experts(h, cfg.moe.expert_intermediate_size, cfg.moe.num_experts)
            for name in ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"):
                setattr(self, name, RMSNorm(h, eps))
        if cfg.per_layer_input_size:
            p = cfg.per_layer_input_size
            self.per_layer_input_gate = StableLinear(h, p, bias=False)
            self.per_layer_projection = StableLinear(p, h, bias=False)
            self.post_per_layer_input_norm = RMSNorm(h, eps)
        self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, x, cos, sin, step, layer):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, step, layer))
        ff = self.mlp(self.pre_feedforward_layernorm(x))
        if self.cfg.moe is not None:
            flat = x.reshape(-1, x.shape[-1])                                          # [n, H]
            weights, ids = self.router.route(flat)
            routed = mix_experts(self.pre_feedforward_layernorm_2(flat), weights, ids, self.experts, self.cfg.moe)
            ff = self.post_feedforward_layernorm_1(ff) + self.post_feedforward_layernorm_2(routed.view(x.shape))
        x = x + self.post_feedforward_layernorm(ff)
        if self.cfg.per_layer_input_size:
            gate = lanewise(gelu_tanh, self.per_layer_input_gate(x)) * step.per_layer_inputs[:, :, layer]
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(gate))
        return x * self.layer_scalar


class PerLayerEmbeddings(nn.Module):
    """Gemma 4's per-layer inputs: for each layer a P-wide vector from the token id (its own table,
    scaled by √P) and from the scaled embedding (projected, × H^-1/2, RMS-normed), summed × 2^-1/2."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        n, p = cfg.num_layers, cfg.per_layer_input_size
        self.layers, self.size, self.hidden = n, p, cfg.hidden_size
        self.embed_tokens_per_layer = nn.Embedding(cfg.per_layer_vocab_size, n * p)
        self.per_layer_model_projection = StableLinear(cfg.hidden_size, n * p, bias=False)
        self.per_layer_projection_norm = RMSNorm(p, cfg.rms_norm_eps)

    def forward(self, ids: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """ids [b, t], embedded [b, t, H] (scaled) -> [b, t, layers, P]."""
        table = self.embed_tokens_per_layer.weight
        tok = self.embed_tokens_per_layer(ids) * torch.tensor(self.size ** 0.5, dtype=table.dtype)
        ctx = self.per_layer_model_projection(embedded) * self.hidden ** -0.5
        ctx = self.per_layer_projection_norm(ctx.reshape(*ids.shape, self.layers, self.size))
        return (ctx + tok.reshape(*ids.shape, self.layers, self.size)) * 2 ** -0.5


class TypedRotary:
    """cos/sin per layer type: Gemma 4's sliding layers (default RoPE over head_dim) and full layers
    (their own RoPE over global_head_dim)."""

    def __init__(self, cfg: TargetConfig):
        self.by_type = {"sliding_attention": Rotary(cfg.rope, cfg.head_dim),
                        "full_attention": Rotary(cfg.global_rope or cfg.rope, cfg.global_head_dim or cfg.head_dim)}

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[dict, dict]:
        pairs = {kind: r.cos_sin(positions, dtype) for kind, r in self.by_type.items()}
        return {k: c for k, (c, _) in pairs.items()}, {k: s for k, (_, s) in pairs.items()}
