"""Drafters trained with interleaved (GPT-J) RoPE, run on the NeoX rotation.

GPT-J rotates the pairs (x[2i], x[2i+1]) of a head by angle i; NeoX rotates (x[i], x[i + d/2]). With
`perm = [0, 2, …, d-2, 1, 3, …, d-1]`, GPT-J's rotation of x is NeoX's rotation of x[perm], read back
through the inverse permutation. Reordering each head's rows of q_proj and k_proj (and their biases) and
the q_norm / k_norm gains by `perm` therefore makes the NeoX path compute the same attention scores
(q·k is unchanged when both sides are permuted alike; V and the output are untouched). The reorder
happens once at load (`load_drafter`), and `save_drafter` undoes it, so a saved drafter keeps the
layout it was published in. LiquidAI's LFM2.5 DSpark drafters say `"rope_is_neox_style": false`.
"""

from __future__ import annotations

import re

import torch

from ..errors import CheckpointError

_ROTATED = re.compile(r"^layers\.\d+\.self_attn\.(q_proj|k_proj|q_norm|k_norm)\.(weight|bias)$")


def interleaved_order(head_dim: int) -> torch.Tensor:
    """perm [head_dim]: the even lanes, then the odd ones."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def reorder_rotated(tensors: dict[str, torch.Tensor], head_dim: int, inverse: bool = False) -> dict[str, torch.Tensor]:
    """Per head, the rows of every q/k projection and q/k norm gain in NeoX order (`inverse`: back to
    interleaved order). Other tensors pass through."""
    perm = interleaved_order(head_dim)
    if inverse:
        perm = torch.argsort(perm)
    out = {}
    for name, t in tensors.items():
        if _ROTATED.match(name):
            if t.shape[0] % head_dim:
                raise CheckpointError(f"drafter {name} has {t.shape[0]} rows, not whole heads of head_dim={head_dim}")
            heads = t.reshape(-1, head_dim, *t.shape[1:])                        # [heads, d, (in)]
            t = heads[:, perm.to(t.device)].reshape(t.shape)
        out[name] = t
    return out
