"""Scaled dot-product attention with grouped KV heads and an explicit visibility mask.

The caller decides what each query may see (causal, sliding window, non-causal
block); this module only computes softmax(qk^T) v. Masks are boolean
`[batch or 1, 1, q_len, k_len]`, True = visible; None = everything visible.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None,
           scale: float) -> torch.Tensor:
    """q [b, h, tq, d], k/v [b, hkv, tk, d] -> [b, tq, h*d]."""
    groups = int(q.shape[1]) // int(k.shape[1])                      # head counts are static
    if torch.onnx.is_in_onnx_export() and groups > 1:                # the exporter lacks enable_gqa
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        groups = 1
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale, enable_gqa=groups > 1)
    b, h, tq, d = out.shape
    return out.transpose(1, 2).reshape(b, tq, h * d)


def causal_visibility(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None,
                      causal: bool = True) -> torch.Tensor:
    """Visibility by absolute position: q_pos [b, tq], k_pos [b, tk] -> [b, 1, tq, tk].

    causal: k <= q; window: |q - k| < window (one-sided when causal).
    """
    diff = q_pos[:, :, None] - k_pos[:, None, :]
    visible = torch.ones_like(diff, dtype=torch.bool)
    if causal:
        visible = visible & (diff >= 0)
    if window is not None:
        visible = visible & (diff < window)
        if not causal:
            visible = visible & (-diff < window)
    return visible[:, None]
