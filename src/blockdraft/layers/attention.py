"""Scaled dot-product attention with grouped KV heads and an explicit visibility mask.

The caller decides what each query may see (causal, sliding window, non-causal
block); this module only computes softmax(qk^T) v. Masks are boolean
`[batch or 1, 1, q_len, k_len]`, True = visible; None = everything visible.

On the CPU the product is written out (float64 products of the bf16 values, an fp32 softmax,
the sum over keys in fixed blocks) instead of calling `scaled_dot_product_attention`: its fused
kernel rounds a query row differently depending on how many rows and keys share the
call, so a verify row would not equal the one-row decoding step it replaces. The
written-out form gives the same bits for a row whatever the other rows and however
many masked keys follow (tested), which is what lossless bf16 speculation needs.
Training (autograd recording through q/k/v) needs no such invariance and runs the fused
kernel (the float64 form cost ~0.3 s of a ~6 s drafter-training step).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ..cache.views import KEY_BLOCK


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None,
           scale: float) -> torch.Tensor:
    """q [b, h, tq, d], k/v [b, hkv, tk, d] -> [b, tq, h*d]."""
    groups = int(q.shape[1]) // int(k.shape[1])                      # head counts are static
    exporting = torch.onnx.is_in_onnx_export()                        # (asked once: it costs ~6 us)
    if exporting and groups > 1:                                      # the exporter lacks enable_gqa
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        groups = 1
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if q.device.type == "cpu" and not exporting and not training:
        out = _row_stable(q, k, v, visible, scale, groups)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale, enable_gqa=groups > 1)
    b, h, tq, d = out.shape
    return out.transpose(1, 2).reshape(b, tq, h * d)


QUERY_CHUNK = 128      # query rows per pass: bounds the float64 score tensor on long prefills


def _row_stable(q, k, v, visible, scale: float, groups: int) -> torch.Tensor:
    tq = q.shape[2]
    if tq <= QUERY_CHUNK:
        return _row_stable_chunk(q, k, v, visible, scale, groups)
    parts = []
    for lo in range(0, tq, QUERY_CHUNK):               # rows are independent: chunking changes no bits
        vis = None if visible is None else visible[:, :, lo:lo + QUERY_CHUNK]
        parts.append(_row_stable_chunk(q[:, :, lo:lo + QUERY_CHUNK], k, v, vis, scale, groups))
    return torch.cat(parts, dim=2)


def _row_stable_chunk(q, k, v, visible, scale: float, groups: int) -> torch.Tensor:
    """softmax(q k^T * scale) v whose bits for a query row depend only on that row, the keys it
    sees and its mask, at SDPA's precision (fp32-or-better scores, bf16 weights, wide sums).

    Both products run in float64 on bf16/fp32 values: a product of two bf16 numbers is exact
    there, so a 64-term score sums exactly in any order; the weighted sum over keys (the one
    reduction whose length varies) runs in fixed blocks of KEY_BLOCK keys added in key order, so
    keys padded or masked past a row add exact zeros."""
    b, h, tq, d = q.shape
    hkv, tk = h // groups, k.shape[2]
    nb = -(-tk // KEY_BLOCK)
    pad = nb * KEY_BLOCK - tk
    if pad:
        k, v = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
    if visible is None:
        visible = torch.ones(1, 1, tq, tk, dtype=torch.bool, device=q.device)
    if pad:                                                                     # padding keys never visible
        visible = F.pad(visible, (0, pad))
    hidden = ~visible.expand(b, 1, tq, tk + pad)[:, :, None]
    scores = torch.matmul(q.reshape(b, hkv, groups * tq, d).double(), k.transpose(-1, -2).double())
    scores = scores.float().view(b, hkv, groups, tq, tk + pad)                  # [b, hkv, g, tq, TK]
    scores = scores.masked_fill_(hidden, float("-inf"))                         # inference only: in place
    peak = scores.amax(-1, keepdim=True).clamp_min_(-3.0e38)                    # max is exact; all-masked rows finite
    probs = torch.exp_(scores.sub_(peak).mul_(scale))                           # masked -> 0
    probs = probs.to(q.dtype).double().view(b, hkv, groups * tq, nb, KEY_BLOCK).transpose(2, 3)  # [b,hkv,nb,g*tq,KB]
    denom = probs.sum(-1, keepdim=True)                                         # [b, hkv, nb, g*tq, 1]
    parts = torch.matmul(probs, v.view(b, hkv, nb, KEY_BLOCK, d).double())      # [b, hkv, nb, g*tq, d]
    acc, total = parts[:, :, 0], denom[:, :, 0]
    for i in range(1, nb):                                                      # blocks added in key order
        acc, total = acc + parts[:, :, i], total + denom[:, :, i]
    out = (acc / total.clamp_min(1e-300)).to(q.dtype)                           # rows that see nothing -> 0
    return out.view(b, hkv, groups, tq, d).reshape(b, h, tq, d)
