"""Modules on the per-token path: `module(x)` calls `forward` directly.

nn.Module's `__call__` looks for hooks on every call (~0.7 us here). A decoding step of the
default model makes ~270 such calls (30 layers of norms, attention, MLP and projections) and
blockdraft registers no hooks: an int4 SmolLM2 step measured 1-3% faster without them.
"""

from torch import nn


class DirectCall(nn.Module):
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)
