"""A linear layer whose every output row is computed the same way whatever the row count.

CPU GEMM libraries pick kernels by shape: oneDNN's bf16 path on AMX/AVX512-BF16 CPUs runs
small row counts through a kernel that reduces each row on its own, larger ones through
blocked tiles that round differently. A verify pass over `anchor + k drafts` must round each
row exactly as a one-row decoding step does (that is what makes speculation lossless in
bf16), and so must a request batched beside others. `ROW_CHUNK` rows at a time keeps every
call on the row-independent kernel: measured invariant on this project's CPUs (AVX2 with
emulated bf16, and AMX) for every row count, in bf16 (`tests/models/test_row_invariance.py`
checks it on the machine it runs on). CUDA and fp32 are passed through unchanged (fp32 on
MKL is not row-invariant at any chunk size: `numerics.py` says so).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

ROW_CHUNK = 16


def stable_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear on the rows flattened to 2-D, in chunks of ROW_CHUNK rows for bf16 on the CPU.

    Flattening first also sidesteps a PyTorch trap: a 3-D input that is a slice along the row
    axis (e.g. `hidden[:, :n]` of a block) sends F.linear through bmm, which copies the whole
    weight each call (measured: 129 ms for a 49152 x 576 LM head, against 5 ms for the matmul)."""
    flat = x.reshape(-1, x.shape[-1])                                                    # [rows, in]
    if flat.shape[0] <= ROW_CHUNK or x.dtype != torch.bfloat16 or x.device.type != "cpu":
        out = F.linear(flat, weight, bias)
    else:
        out = torch.cat([F.linear(part, weight, bias) for part in flat.split(ROW_CHUNK)])  # [rows, out]
    return out.view(*x.shape[:-1], weight.shape[0])


class StableLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stable_linear(x, self.weight, self.bias)
