"""Sparse mixture-of-experts feed-forward, one module for every MoE target (Qwen3.5-MoE, LFM2-MoE, gpt-oss).

Routing (`MoeConfig.router`), on logits = router(x) (+ bias where `biases`):
- "softmax" (Qwen3.5): p = softmax(logits) over all experts in fp32, the top-k renormalised;
- "sigmoid" (LFM2): s = sigmoid(logits); the top-k chosen on s + expert_bias, their s renormalised
  (sum + 1e-6, as transformers' `Lfm2MoeTopKRouter`);
- "topk_softmax" (gpt-oss): the top-k logits, softmax over those k in fp32;
then × `routed_scaling`. An expert computes down(act(gate, up)) with `gate_up_proj` [E, 2I, H] holding
the gate rows then the up rows (gpt-oss's interleaved columns are split at load), plus biases where
`biases`. Each token's experts are summed in ascending expert order, plus the
sigmoid-gated shared expert where there is one. Every matmul is row-invariant and a token's sum depends
only on its own experts, so a row's output does not depend on its batch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..config import MoeConfig
from .direct import DirectCall
from .elementwise import lanewise
from .linear import StableLinear, stable_linear
from .mlp import MLP, gelu_tanh


class Router(nn.Module):
    def __init__(self, hidden: int, num_experts: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))
        self.bias = nn.Parameter(torch.zeros(num_experts)) if bias else None


class Experts(nn.Module):
    """Expert weights stacked as transformers keeps Qwen's: gate_up_proj [E, 2I, H], down_proj [E, H, I]
    (and gpt-oss's biases [E, 2I], [E, H])."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, bias: bool = False):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(num_experts, 2 * intermediate)) if bias else None
        self.down_proj_bias = nn.Parameter(torch.zeros(num_experts, hidden)) if bias else None

    def gate_up(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e's gate then up rows for x [n, H] -> [n, 2I]."""
        bias = None if self.gate_up_proj_bias is None else self.gate_up_proj_bias[e]
        return stable_linear(x, self.gate_up_proj[e], bias)

    def down(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e's down projection for x [n, I] -> [n, H]."""
        bias = None if self.down_proj_bias is None else self.down_proj_bias[e]
        return stable_linear(x, self.down_proj[e], bias)


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """gpt-oss: (clamp(up, ±limit) + 1) · g · sigmoid(1.702 g), g = min(gate, limit)."""
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return (up + 1) * (gate * lanewise(torch.sigmoid, gate * 1.702))


class SparseMoe(DirectCall):
    def __init__(self, hidden: int, m: MoeConfig):
        super().__init__()
        self.cfg = m
        self.gate = Router(hidden, m.num_experts, m.biases)
        self.experts = Experts(hidden, m.expert_intermediate_size, m.num_experts, m.biases)
        if m.expert_bias:
            self.register_buffer("expert_bias", torch.zeros(m.num_experts))
        if m.shared_intermediate_size:
            self.shared_expert = MLP(hidden, m.shared_intermediate_size)
            self.shared_expert_gate = StableLinear(hidden, 1, bias=False)

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """flat [n, H] -> (weights [n, k] in flat's dtype, expert ids [n, k])."""
        m = self.cfg
        logits = stable_linear(flat, self.gate.weight, self.gate.bias)           # [n, E]
        if m.router == "softmax":
            scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
            weights, ids = torch.topk(scores, m.top_k, dim=-1)
        elif m.router == "topk_softmax":
            top, ids = torch.topk(logits, m.top_k, dim=-1)
            weights = torch.softmax(top, dim=-1, dtype=torch.float32)
        elif m.router == "sigmoid":
            scores = lanewise(torch.sigmoid, logits.float())
            choice = scores + self.expert_bias.float() if m.expert_bias else scores
            ids = torch.topk(choice, m.top_k, dim=-1).indices
            weights = scores.gather(1, ids)
        else:                  # "normed_softmax" routes in `models/gemma4.py` (its router reads the un-normed stream)
            raise ValueError(f"SparseMoe does not run the {m.router!r} router")
        if m.norm_topk and m.router != "topk_softmax":
            weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-6 if m.router == "sigmoid" else 0.0))
        if m.routed_scaling != 1.0:
            weights = weights * m.routed_scaling
        return weights.to(flat.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])                                          # [n, H]
        weights, ids = self.route(flat)                                          # [n, k]
        out = mix_experts(flat, weights, ids, self.experts, self.cfg)
        if self.cfg.shared_intermediate_size:
            out = out + lanewise(torch.sigmoid, self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.view(shape)


def mix_experts(flat: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, ex: nn.Module,
                m: MoeConfig) -> torch.Tensor:
    """Σ_k weights[:, k] · expert_{ids[:, k]}(flat) for flat [n, H], summed per token in ascending expert order.
    `ex` is `Experts` or its weight-only quantized form (`quant.QuantizedExperts`): an expert runs on its rows only."""
    out = torch.zeros_like(flat)
    for e in torch.unique(ids).tolist():                                         # ascending expert ids
        token, slot = torch.where(ids == e)
        gate, up = ex.gate_up(e, flat[token]).chunk(2, dim=-1)
        if m.activation == "silu":
            act = lanewise(F.silu, gate) * up
        elif m.activation == "gelu_tanh":
            act = lanewise(gelu_tanh, gate) * up
        else:
            act = clamped_swiglu(gate, up, m.swiglu_limit)
        y = ex.down(e, act)
        out.index_add_(0, token, (y * weights[token, slot, None]).to(out.dtype))
    return out


def feed_forward(cfg, layer: int) -> nn.Module:
    """The layer's feed-forward: the MoE block, or a dense SwiGLU MLP (dense targets, and MoE targets'
    first `dense_layers` layers)."""
    if cfg.sparse_layer(layer):
        return SparseMoe(cfg.hidden_size, cfg.moe)
    return MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.hidden_act)
