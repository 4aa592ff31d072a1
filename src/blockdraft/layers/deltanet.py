"""Gated DeltaNet math (Qwen3.5 "linear_attention" layers), one token at a time.

Every row — prefill, one-row decoding, a verify block, a replay after rollback — goes through the
same per-token recurrence, so a state reached by any of them is bitwise the state one-row decoding
reaches (no chunked form whose rounding would depend on how rows are grouped). Each (sequence,
head) is computed on its own, so a row's result does not depend on the batch beside it.

Transcendental elementwise ops (exp, softplus, sigmoid, SiLU) run through `elementwise.lanewise`, so a
value gets the same bits at any row or batch count.

Shapes: conv inputs `[b, rows, conv_dim]`; q, k `[b, rows, H, d_k]`, v `[b, rows, H, d_v]`, g and
beta `[b, rows, H]`, all fp32; the recurrent state `[b, H, d_k, d_v]` fp32.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from . import cpu_kernels as kernels
from .elementwise import lanewise

def causal_conv(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                silu: bool = True) -> torch.Tensor:
    """Depthwise causal conv (+ bias) and SiLU (Gated DeltaNet; LFM2's short conv has none). window
    [b, K-1+t, C] (the K-1 state rows, then t new rows), weight [C, K] -> [b, t, C] fp32. Taps are summed
    in a fixed order, in fp32."""
    k = weight.shape[1]
    t = window.shape[1] - (k - 1)
    w = weight.float().t()                                                              # [K, C]
    x = window.float()
    acc = x[:, 0:t] * w[0]
    for j in range(1, k):
        acc = acc + x[:, j:j + t] * w[j]
    if bias is not None:
        acc = acc + bias.float()
    return lanewise(F.silu, acc) if silu else acc


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (what the FLA kernels and transformers compute)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def delta_rule(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, valid: torch.Tensor | None = None,
               keep_states: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Run the gated delta rule over `rows` tokens from `state` (not modified).

    Per token: S = S·exp(g); S += k ⊗ ((v − Sᵀk)·β); o = Sᵀq (q already scaled by d_k^-½).
    valid [b, rows] (None: all): padding rows leave a sequence's state as it was.
    Returns o [b, rows, H, d_v] fp32, the state after the last valid row, and with `keep_states`
    the state after every row [b, rows, H, d_k, d_v] (else None)."""
    rows = q.shape[1]
    decay = lanewise(torch.exp, g)                                                      # [b, rows, H]
    fast = kernels.delta_rule(state, q, k, v, decay, beta, valid, keep_states)         # C, where it builds
    if fast is not None:
        return fast
    outs, states = [], []
    for i in range(rows):
        decayed = state * decay[:, i, ..., None, None]
        kv_mem = (decayed * k[:, i, ..., None]).sum(-2)                                 # [b, H, d_v]
        delta = (v[:, i] - kv_mem) * beta[:, i, ..., None]
        new = decayed + k[:, i, ..., None] * delta[..., None, :]
        outs.append((new * q[:, i, ..., None]).sum(-2))
        state = new if valid is None else torch.where(valid[:, i, None, None, None], new, state)
        if keep_states:
            states.append(state)
    return torch.stack(outs, 1), state, torch.stack(states, 1) if keep_states else None
