"""Transcendental elementwise ops whose bits do not depend on a tensor's shape.

PyTorch computes exp, softplus, sigmoid or SiLU with a vector routine over whole vectors and a scalar
one over the tail, and the two round differently: the same value would get other bits at another row or
batch count, which a verify row must not. `lanewise` runs such an op on whole vectors only.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

LANES = 64           # a multiple of every ISA's vector width, twice over (torch's loops step two vectors)
SLICE = 16384        # elements per call: below torch's parallel grain, so no thread boundary cuts a vector


def lanewise(fn, x: torch.Tensor) -> torch.Tensor:
    """fn(x) for an elementwise fn, computed so that every element takes the same (vector) path
    whatever the tensor's shape: flattened, padded to whole LANES, in calls of at most SLICE. Under
    tracing (the ONNX export) shapes are symbolic and the graph's runtime computes the op: one call."""
    if torch.jit.is_tracing():
        return fn(x)
    flat = x.reshape(-1)
    n = flat.numel()
    if n % LANES:
        flat = F.pad(flat, (0, LANES - n % LANES))
    out = fn(flat) if flat.numel() <= SLICE else torch.cat([fn(c) for c in flat.split(SLICE)])
    return out[:n].view(x.shape)
