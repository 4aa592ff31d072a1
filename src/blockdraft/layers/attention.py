"""Scaled dot-product attention with grouped KV heads and an explicit visibility mask.

The caller decides what each query may see (causal, sliding window, non-causal
block); this module only computes softmax(qk^T) v. Masks are boolean
`[batch or 1, 1, q_len, k_len]`, True = visible; None = everything visible.

On the CPU the product is written out (float64 products of the bf16 values, an fp32 softmax)
instead of calling `scaled_dot_product_attention`: its fused kernel rounds a query row
differently depending on how many rows and keys share the call, so a verify row would not
equal the one-row decoding step it replaces. The written-out form gives the same bits for a
row whatever the other rows and however many masked keys follow (tested), which is what
lossless bf16 speculation needs; on one-row steps it is also faster than the fused kernel's
masked GQA path.
bf16 on the CPU with a head size that is a multiple of 16 runs blockdraft's own kernel instead
(`layers/cpu_kernels.py`: each row on its own over the keys it sees, fp32 in a fixed order, masked
keys never read; the same property at a fraction of the float64 form's cost); fp32 and other head
sizes keep the float64 form.
Training (autograd recording through q/k/v) needs no such invariance and runs the fused kernel.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from . import cpu_kernels as kernels


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None,
           scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [b, h, tq, d], k/v [b, hkv, tk, d] -> [b, tq, h*d]. `sinks` [h] (gpt-oss): a learned logit per
    head that joins every row's softmax denominator (a key with no value): weights exp(s_j) / (exp(sink)
    + Σ exp(s_j')), so a row may give less than all of its weight to the keys."""
    groups = int(q.shape[1]) // int(k.shape[1])                      # head counts are static
    exporting = torch.onnx.is_in_onnx_export()                        # (asked once: it costs ~6 us)
    if exporting and groups > 1:                                      # the exporter lacks enable_gqa
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        groups = 1
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if q.device.type == "cpu" and not exporting and not training:
        if sinks is None and kernels.attention_fits(q, k):
            return kernels.attend(q, k, v, visible, scale)
        out = _row_stable(q, k, v, visible, scale, groups, sinks)
    elif sinks is not None:
        out = _with_sinks(q, k, v, visible, scale, groups, sinks)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale, enable_gqa=groups > 1)
    b, h, tq, d = out.shape
    return out.transpose(1, 2).reshape(b, tq, h * d)


QUERY_CHUNK = 128      # query rows per pass: bounds the float64 score tensor on long prefills


def _with_sinks(q, k, v, visible, scale: float, groups: int, sinks: torch.Tensor) -> torch.Tensor:
    """Attention with sinks where no fused kernel takes them (CUDA, training): the sink is one more
    column of the fp32 softmax, dropped before the values."""
    b, h, tq, _ = q.shape
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale                   # [b, h, tq, tk]
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    scores = torch.cat([scores, sinks.float().view(1, h, 1, 1).expand(b, h, tq, 1)], dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., :-1]
    return torch.matmul(probs.to(v.dtype), v)


def _row_stable(q, k, v, visible, scale: float, groups: int, sinks: torch.Tensor | None = None) -> torch.Tensor:
    tq = q.shape[2]
    if tq <= QUERY_CHUNK:
        return _row_stable_chunk(q, k, v, visible, scale, groups, sinks)
    parts = []
    for lo in range(0, tq, QUERY_CHUNK):               # rows are independent: chunking changes no bits
        vis = None if visible is None else visible[:, :, lo:lo + QUERY_CHUNK]
        parts.append(_row_stable_chunk(q[:, :, lo:lo + QUERY_CHUNK], k, v, vis, scale, groups, sinks))
    return torch.cat(parts, dim=2)


def _masked_out(visible: torch.Tensor, b: int, tq: int, tk: int) -> torch.Tensor:
    """~visible as [b, 1, 1, tq, tk] (broadcast over KV heads and groups), made once per mask tensor:
    every layer of a step attends through the same one."""
    hidden = getattr(visible, "_masked_out", None)
    if hidden is None or hidden.shape != (b, 1, 1, tq, tk):
        hidden = ~visible.expand(b, 1, tq, tk)[:, :, None]
        visible._masked_out = hidden
    return hidden


def _row_stable_chunk(q, k, v, visible, scale: float, groups: int, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v whose bits for a query row depend only on that row, the keys it
    sees and its mask, at SDPA's precision (fp32-or-better scores, bf16 weights, wide sums).

    Both products run in float64 on bf16/fp32 values: a product of two bf16 numbers is exact
    there, and so are the sums (64 products for a score; the keys' bf16 probabilities and their
    products with bf16 values for the output) unless their terms span ~30 binary orders of
    magnitude, so a kernel's summation order does not reach the result; masked keys add exact
    zeros. A sink is one more score column (in the unscaled scores' units), summed into the
    denominator only."""
    b, h, tq, d = q.shape
    hkv, tk = h // groups, k.shape[2]
    scores = torch.matmul(q.reshape(b, hkv, groups * tq, d).double(), k.double().transpose(-1, -2)).float()
    scores = scores.view(b, hkv, groups, tq, tk)                                # [b, hkv, g, tq, tk]
    if visible is not None:
        scores.masked_fill_(_masked_out(visible, b, tq, tk), float("-inf"))     # inference only: in place
    if sinks is not None:                                                       # [b, hkv, g, tq, tk + 1]
        column = (sinks.float() / scale).view(1, hkv, groups, 1, 1).expand(b, hkv, groups, tq, 1)
        scores = torch.cat([scores, column], dim=-1)
    peak = scores.amax(-1, keepdim=True).clamp_min_(-3.0e38)                    # max is exact; all-masked rows finite
    probs = torch.exp_(scores.sub_(peak).mul_(scale))                           # masked -> 0
    probs = probs.to(q.dtype).double().view(b, hkv, groups * tq, -1)            # [b, hkv, g*tq, tk (+1)]
    total = probs.sum(-1, keepdim=True).clamp_min_(1e-300)
    out = torch.matmul(probs[..., :tk], v.double()).div_(total)                 # seeing nothing -> 0
    return out.to(q.dtype).view(b, hkv, groups, tq, d).reshape(b, h, tq, d)
