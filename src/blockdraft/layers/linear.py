"""A linear layer whose every output row is computed the same way whatever the row count.

CPU GEMM libraries pick kernels by shape: oneDNN's bf16 path on AMX/AVX512-BF16 CPUs runs
small row counts through a kernel that reduces each row on its own, larger ones through
blocked tiles that round differently. A verify pass over `anchor + k drafts` must round each
row exactly as a one-row decoding step does (that is what makes speculation lossless in
bf16), and so must a request batched beside others. Rows go through in chunks of at most 16,
which keeps every call on the row-independent kernel for every shape on AVX2 (emulated bf16)
and AMX. An AVX512-BF16 EPYC without AMX differs: reductions up to 1024 wide are row-independent
at every row count, wider ones (SmolLM2's 1536-wide down projection) are not even at 2 rows.
There the reduction is cut into slices that are (two of 768, their bf16 products added in
fp32; one-row calls too, so plain decoding and a verify compute the same thing): +40% on that
matmul for one row, where one row per call would cost 6x on a 9-row verify. What each weight
shape needs is measured once on the machine that runs it (`reduction_slices`), and
`tests/models/test_row_invariance.py` checks the result there. CUDA and fp32 are passed
through unchanged (fp32 on MKL is not row-invariant at any chunk size: `numerics.py` says so).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .direct import DirectCall

ROW_CHUNK = 16                                   # the most rows one call takes
_slices: dict[tuple[int, int, int], int] = {}    # (out, in, threads) -> reduction slices (0: row by row)


def cached_on(weight: torch.Tensor, name: str, extra, make):
    """`make(weight)` for a frozen weight, cached on it under `name` (remade if it is written in place)."""
    try:
        version = weight._version
    except RuntimeError:        # an inference tensor: no version counter
        version = None
    key = (version, weight.data_ptr(), extra)
    cached = getattr(weight, name, None)
    if cached is None or cached[0] != key:
        cached = (key, make(weight.detach()))
        setattr(weight, name, cached)
    return cached[1]


def _weight_slices(weight: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """Contiguous column slices of a frozen weight, cached on it."""
    return cached_on(weight, "_reduction_slices", parts, lambda w: [c.contiguous() for c in w.chunk(parts, dim=1)])


def fp32_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight.float()`, cached for a frozen weight (uncached, the DSpark Markov W2 would be converted
    once per slot: 8 x 12288 x 64 per drafting step); a weight being trained converts each call (autograd)."""
    if weight.dtype == torch.float32 or (weight.requires_grad and torch.is_grad_enabled()):
        return weight.float()
    return cached_on(weight, "_fp32", None, lambda w: w.float())


def _sliced(flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, parts: int) -> torch.Tensor:
    """flat [rows, in] @ weight.T + bias with the reduction cut into `parts` equal slices: each
    slice's bf16 product is added in fp32 (with the bias), then rounded once more to bf16."""
    if parts == 1:
        return F.linear(flat, weight, bias)
    acc = None if bias is None else bias.float()
    for x, w in zip(flat.chunk(parts, dim=1), _weight_slices(weight, parts)):
        y = F.linear(x, w).float()
        acc = y if acc is None else acc + y
    return acc.to(flat.dtype)


def reduction_slices(out_features: int, in_features: int) -> int:
    """How this machine's bf16 CPU kernels must be called for a weight of this shape so that every
    row rounds as it does alone, at any row count up to ROW_CHUNK: 1 = plain calls; n > 1 = the
    reduction cut into n slices (each on the row-independent kernel); 0 = one row per call.
    Measured once per shape (`plan_linears` does it at load): random data with a wide exponent
    range (so a different accumulation order shows in the bf16 result), every row count
    2..ROW_CHUNK against one row at a time, bitwise."""
    key = (out_features, in_features, torch.get_num_threads())
    if key in _slices:
        return _slices[key]
    g = torch.Generator().manual_seed(0)

    def wide(*shape):
        scale = torch.exp2(torch.randint(-6, 7, shape, generator=g, dtype=torch.int8).to(torch.bfloat16))
        return torch.randn(*shape, generator=g, dtype=torch.bfloat16) * scale

    w, x = wide(out_features, in_features), wide(2 * ROW_CHUNK, in_features)
    found = 0
    with torch.no_grad():
        for parts in (1, 2, 3, 4, 6, 8):
            if in_features % parts or in_features // parts < 64:
                continue
            one = torch.cat([_sliced(row, w, None, parts) for row in x.split(1)])
            if all(torch.equal(torch.cat([_sliced(c, w, None, parts) for c in x.split(r)]), one)
                   for r in range(2, ROW_CHUNK + 1)):
                found = parts
                break
    _slices[key] = found
    return found


def plan_linears(model: nn.Module) -> None:
    """Measure `reduction_slices` for every bf16 CPU weight shape of `model` now (at load), so the
    first request does not pay for it."""
    for m in model.modules():
        w = getattr(m, "weight", None)
        if isinstance(m, nn.Linear) and w is not None and w.dtype == torch.bfloat16 and w.device.type == "cpu":
            reduction_slices(*w.shape)


def stable_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear on the rows flattened to 2-D; for bf16 on the CPU in calls of at most ROW_CHUNK
    rows, each made as `reduction_slices` measured for this shape (one-row calls included, so a
    row rounds the same alone or beside others).

    Flattening first also sidesteps a PyTorch trap: a 3-D input that is a slice along the row
    axis (e.g. `hidden[:, :n]` of a block) sends F.linear through bmm, which copies the whole
    weight each call (measured: 129 ms for a 49152 x 576 LM head, against 5 ms for the matmul)."""
    flat = x.reshape(-1, x.shape[-1])                                                    # [rows, in]
    # under autocast (drafter training: fp32 master weights, bf16 compute) rows need not round alike,
    # and whole-matrix GEMMs are what keep oneDNN's AMX tiles busy; inference never autocasts
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or torch.is_autocast_enabled("cpu"):
        out = F.linear(flat, weight, bias)
    else:
        parts = reduction_slices(*weight.shape)
        chunk, parts = (ROW_CHUNK, parts) if parts else (1, 1)       # 0: one row per call, uncut
        if flat.shape[0] <= chunk:
            out = _sliced(flat, weight, bias, parts)
        else:
            out = torch.cat([_sliced(c, weight, bias, parts) for c in flat.split(chunk)])  # [rows, out]
    return out.view(*x.shape[:-1], weight.shape[0])


class StableLinear(DirectCall, nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stable_linear(x, self.weight, self.bias)
