"""The gated feed-forward: down(act(gate(x)) * up(x)), act SiLU (SwiGLU) or tanh-approximated GELU (Gemma)."""

from __future__ import annotations

from functools import partial

import torch
from torch.nn import functional as F

from . import cpu_kernels as kernels
from .direct import DirectCall
from .elementwise import lanewise
from .linear import StableLinear


gelu_tanh = partial(F.gelu, approximate="tanh")


class MLP(DirectCall):
    """Gated feed-forward (every target family's dense MLP and the drafters'): SwiGLU, or GeGLU with
    `act="gelu_tanh"`."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, act: str = "silu"):
        super().__init__()
        self.act = act
        self.gate_proj = StableLinear(hidden, intermediate, bias=bias)
        self.up_proj = StableLinear(hidden, intermediate, bias=bias)
        self.down_proj = StableLinear(intermediate, hidden, bias=bias)
        self.gate_up_proj = None      # gate and up in one matmul when `layers/quant.py` fuses them

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        if self.act != "silu":
            return self.down_proj(lanewise(gelu_tanh, gate) * up)
        act = kernels.swiglu(gate, up)          # bf16 CPU inference: the fused layers' SiLU (same bits)
        return self.down_proj(lanewise(F.silu, gate) * up if act is None else act)
