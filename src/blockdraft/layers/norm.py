"""RMSNorm as Llama/Qwen3 define it: statistics in fp32, weight applied after the cast back."""

import torch
from torch import nn

from . import cpu_kernels as kernels
from .direct import DirectCall


def rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) in fp32; the mean as sum then divide: what the CPU's own `mean` computes,
    in fewer dispatches (same bits). The gain and the cast back are each norm's own."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).sum(-1, keepdim=True).div_(x.shape[-1]).add_(eps))


class RMSNorm(DirectCall):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = kernels.rms_norm(x, self.weight, self.eps)          # bf16 inference on the CPU: one call
        if fused is not None:
            return fused
        return self.weight * rms_normalized(x, self.eps).to(x.dtype)
