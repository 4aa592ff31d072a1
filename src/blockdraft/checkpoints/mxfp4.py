"""MXFP4 weights (OCP microscaling FP4, as gpt-oss publishes its experts) -> bf16.

A tensor `W [*, rows, cols]` is stored as `blocks` uint8 [*, rows, cols / 32, 16] and `scales` uint8
[*, rows, cols / 32]: each group of 32 values along `cols` shares the scale 2^(byte - 127), and each
value is an E2M1 code (sign, 2 exponent bits, 1 mantissa bit), two per byte — the low nibble the even
element, the high nibble the odd one. Every product code × 2^e is exact in bf16 (8 exponent bits),
so this gives the same values as transformers' `integrations/mxfp4.py`.
"""

from __future__ import annotations

import torch

from ..errors import CheckpointError

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
GROUP = 32
ROWS = 4096                # rows dequantized per chunk


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, name: str = "") -> torch.Tensor:
    """blocks [*, rows, G, 16] uint8, scales [*, rows, G] uint8 -> [*, rows, G * 32] bf16."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise CheckpointError(f"target: MXFP4 tensor {name} must be uint8 blocks and scales, got "
                              f"{blocks.dtype} and {scales.dtype}")
    if blocks.shape[-1] != GROUP // 2 or blocks.shape[:-1] != scales.shape:
        raise CheckpointError(f"target: MXFP4 tensor {name}: blocks {tuple(blocks.shape)} and scales "
                              f"{tuple(scales.shape)} do not pair (blocks [..., G, 16], scales [..., G])")
    lut = torch.tensor(E2M1, dtype=torch.float32)
    out = torch.empty(*scales.shape[:-1], scales.shape[-1] * GROUP, dtype=torch.bfloat16)
    flat_blocks, flat_scales, flat_out = blocks.reshape(-1, *blocks.shape[-2:]), scales.reshape(-1, scales.shape[-1]), \
        out.view(-1, out.shape[-1])
    for lo in range(0, flat_out.shape[0], ROWS):     # in row chunks: the fp32 temporaries stay small
        part = flat_blocks[lo:lo + ROWS]
        codes = torch.stack([part & 0x0F, part >> 4], dim=-1).long()                  # [rows, G, 16, 2]
        values = torch.ldexp(lut[codes].flatten(-2), flat_scales[lo:lo + ROWS].to(torch.int32)[..., None] - 127)
        flat_out[lo:lo + ROWS] = values.flatten(-2)                                   # [rows, G * 32]
    return out
