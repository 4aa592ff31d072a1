"""LFM2 short-convolution layers (transformers `lfm2`): y = out_proj(C ⊙ conv(B ⊙ x)), [B, C, x] = in_proj(h).

The conv is depthwise and causal over `conv_L_cache` taps, with no activation; its state is the last
`conv_L_cache - 1` rows of B ⊙ x, kept per sequence in `cache/state.py` like a DeltaNet's (no
recurrence: rollback is a gather). LFM2's attention layers are Qwen3-style (per-head q/k RMSNorm, full
rotary) and its feed-forward is SwiGLU: `decoder.DecoderLayer` runs them, the checkpoint's names mapped
at load (`families/lfm2.py`). For bf16 inference on the CPU the conv and its gates run in one kernel call, and
with weight-only linear layers the whole short-conv layer does (`cpu_kernels.short_conv`, `conv_layer`: the
bits of the modules' spelling below).
"""

from __future__ import annotations

import torch
from torch import nn

from ..cache.state import LayerRecord
from ..config import TargetConfig
from ..layers import cpu_kernels as kernels
from ..layers.deltanet import causal_conv
from ..layers.direct import DirectCall
from ..layers.linear import StableLinear
from ..layers.mlp import MLP
from ..layers.norm import RMSNorm
from ..layers.quant import QuantizedLinear


class ShortConv(DirectCall):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        c = cfg.short_conv
        h = cfg.hidden_size
        self.in_proj = StableLinear(h, 3 * h, bias=c.bias)
        self.out_proj = StableLinear(h, h, bias=c.bias)
        self.conv = nn.Module()
        self.conv.weight = nn.Parameter(torch.empty(h, 1, c.conv_kernel))                 # HF's Conv1d layout
        if c.bias:
            self.conv.bias = nn.Parameter(torch.zeros(h))
        self.bias = c.bias

    def forward(self, x: torch.Tensor, state, layer: int) -> torch.Tensor:
        """x [b, t, hidden]; `state` a `StateStep` -> [b, t, hidden]."""
        conv_state, _ = state.initial(layer)                                               # [b, K-1, hidden]
        proj = self.in_proj(x)                                                             # [b, t, 3 hidden]
        if (fused := kernels.short_conv(proj, conv_state, self.conv.weight[:, 0],
                                        self.conv.bias if self.bias else None)) is not None:
            bx, y = fused                                       # bf16 on the CPU: the bits of the lines below
            state.record(layer, LayerRecord(bx))
            return self.out_proj(y)
        b_gate, c_gate, h = proj.chunk(3, dim=-1)
        bx = b_gate * h                                                                    # [b, t, hidden]
        state.record(layer, LayerRecord(bx))
        conv = causal_conv(torch.cat([conv_state.to(bx.dtype), bx], 1), self.conv.weight[:, 0],
                           self.conv.bias if self.bias else None, silu=False)
        return self.out_proj(c_gate * conv.to(x.dtype))


class ShortConvLayer(DirectCall):
    def __init__(self, cfg: TargetConfig, mlp: nn.Module):
        super().__init__()
        self.conv = ShortConv(cfg)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, step, layer):
        if (one_call := self._in_one_call(x, step.state, layer)) is not None:
            return one_call
        x = x + self.conv(self.input_layernorm(x), step.state, layer)
        return x + self.mlp(self.post_attention_layernorm(x))

    def _in_one_call(self, x: torch.Tensor, state, layer: int) -> torch.Tensor | None:
        """The whole layer in one kernel call (`cpu_kernels.conv_layer`: the bits of the lines in `forward`) where
        its kernels take every part: plain RMSNorms of one eps, the projections and a SwiGLU MLP's fused gate and up
        packed at one width, no projection bias; else None."""
        conv, mlp, norms = self.conv, self.mlp, (self.input_layernorm, self.post_attention_layernorm)
        if type(mlp) is not MLP or mlp.act != "silu" or any(type(n) is not RMSNorm for n in norms):
            return None
        parts = (conv.in_proj, conv.out_proj, mlp.gate_up_proj, mlp.down_proj)
        if (any(not isinstance(p, QuantizedLinear) or p.kernel != "qgemm" or p.bias is not None for p in parts)
                or len({(p.bits, p.act_bits) for p in parts}) > 1 or norms[0].eps != norms[1].eps):
            return None
        conv_state, _ = state.initial(layer)                                               # [b, K-1, hidden]
        done = kernels.conv_layer(x, (norms[0].weight, norms[1].weight), norms[0].eps, parts, conv_state,
                                  conv.conv.weight[:, 0], conv.conv.bias if conv.bias else None)
        if done is None:
            return None
        out, bx = done
        state.record(layer, LayerRecord(bx))
        return out
