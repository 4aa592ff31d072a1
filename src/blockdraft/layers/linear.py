"""A linear layer whose every output row is computed the same way whatever the row count.

CPU GEMM libraries pick kernels by shape: oneDNN's bf16 path on AMX/AVX512-BF16 CPUs runs
small row counts through a kernel that reduces each row on its own, larger ones through
blocked tiles that round differently. A verify pass over `anchor + k drafts` must round each
row exactly as a one-row decoding step does (that is what makes speculation lossless in
bf16), and so must a request batched beside others. Rows go through in chunks of at most 16,
which keeps every call on the row-independent kernel for every shape on AVX2 (emulated bf16)
and AMX. An AVX512-BF16 EPYC without AMX differs: reductions up to 1024 wide are row-independent
at every row count, wider ones (SmolLM2's 1536-wide down projection) are not even at 2 rows.
There the reduction is cut into slices that are (two of 768, summed in fp32; one-row calls
too, so plain decoding and a verify compute the same thing): +40% on that matmul for one row,
where one row per call would cost 6x on a 9-row verify. What each weight shape needs is
measured once on the machine that runs it (`reduction_slices`), and
`tests/models/test_row_invariance.py` checks the result there. CUDA and fp32 are passed through unchanged (fp32 on MKL is not
row-invariant at any chunk size: `numerics.py` says so).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

ROW_CHUNK = 16                                   # the most rows one call takes
_slices: dict[tuple[int, int, int], int] = {}    # (out, in, threads) -> reduction slices (0: row by row)


def _sliced(flat: torch.Tensor, weight: torch.Tensor, parts: int) -> torch.Tensor:
    """flat [rows, in] @ weight.T with the reduction cut into `parts` equal slices summed in fp32."""
    if parts == 1:
        return F.linear(flat, weight)
    ws = getattr(weight, "_reduction_slices", None)
    if ws is None or len(ws) != parts:          # contiguous weight slices, made once per weight
        ws = [w.contiguous() for w in weight.chunk(parts, dim=1)]
        weight._reduction_slices = ws
    acc = None
    for x, w in zip(flat.chunk(parts, dim=1), ws):
        y = F.linear(x, w).float()
        acc = y if acc is None else acc + y
    return acc.to(flat.dtype)


def reduction_slices(out_features: int, in_features: int) -> int:
    """How this machine's bf16 CPU kernels must be called for a weight of this shape so that every
    row rounds as it does alone, at any row count up to ROW_CHUNK: 1 = plain calls; n > 1 = the
    reduction cut into n slices (each on the row-independent kernel) summed in fp32; 0 = one row
    per call. Measured on first use: random data with a wide exponent range (so a different
    accumulation order shows in the bf16 result), every row count 2..ROW_CHUNK against one row
    at a time, bitwise."""
    key = (out_features, in_features, torch.get_num_threads())
    if key in _slices:
        return _slices[key]
    g = torch.Generator().manual_seed(0)

    def wide(*shape):
        return (torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-6, 7, shape, generator=g).float())
                ).bfloat16()

    w, x = wide(out_features, in_features), wide(2 * ROW_CHUNK, in_features)
    _slices[key] = 0
    with torch.no_grad():
        for parts in (1, 2, 3, 4, 6, 8):
            if in_features % parts or in_features // parts < 64:
                continue
            one = torch.cat([_sliced(row, w, parts) for row in x.split(1)])
            if all(torch.equal(torch.cat([_sliced(c, w, parts) for c in x.split(r)]), one)
                   for r in range(2, ROW_CHUNK + 1)):
                _slices[key] = parts
                break
    return _slices[key]


def stable_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear on the rows flattened to 2-D; for bf16 on the CPU in calls of at most ROW_CHUNK
    rows, each made as `reduction_slices` measured for this shape (one-row calls included, so a
    row rounds the same alone or beside others).

    Flattening first also sidesteps a PyTorch trap: a 3-D input that is a slice along the row
    axis (e.g. `hidden[:, :n]` of a block) sends F.linear through bmm, which copies the whole
    weight each call (measured: 129 ms for a 49152 x 576 LM head, against 5 ms for the matmul)."""
    flat = x.reshape(-1, x.shape[-1])                                                    # [rows, in]
    if x.dtype != torch.bfloat16 or x.device.type != "cpu":
        out = F.linear(flat, weight, bias)
    else:
        parts = reduction_slices(*weight.shape)
        chunk = ROW_CHUNK if parts else 1
        if parts == 1 and flat.shape[0] <= chunk:
            out = F.linear(flat, weight, bias)
        else:
            out = torch.cat([_sliced(c, weight, max(1, parts)) for c in flat.split(chunk)])  # [rows, out]
            out = out if bias is None else out + bias
    return out.view(*x.shape[:-1], weight.shape[0])


class StableLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stable_linear(x, self.weight, self.bias)
