"""RMSNorm as Llama/Qwen3 define it: statistics in fp32, weight applied after the cast back."""

import torch
from torch import nn

from . import cpu_kernels as kernels
from .direct import DirectCall


class RMSNorm(DirectCall):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = kernels.rms_norm(x, self.weight, self.eps)          # bf16 inference on the CPU: one call
        if fused is not None:
            return fused
        x32 = x.float()
        # the mean as sum then divide: what the CPU's own `mean` computes, in fewer dispatches (same bits)
        variance = x32.pow(2).sum(-1, keepdim=True).div_(x.shape[-1]).add_(self.eps)
        return self.weight * (x32 * torch.rsqrt(variance)).to(x.dtype)
