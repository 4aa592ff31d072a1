"""Verify/accept: decide how many drafts the target keeps and what token follows them.

Greedy is exact prefix match + the target's argmax at the first mismatch
(correction) or after the last draft (bonus). Sampling is Leviathan/Chen
rejection sampling, so the output distribution is exactly the target's.
"""

from __future__ import annotations

import torch

from ..sampling.probs import sample_from


def greedy_accept_ids(drafts: list[int], target_argmax: list[int]) -> tuple[int, int]:
    """Accept the longest prefix with d_i == argmax p_i; the next token is the target's argmax
    right after it (a correction at the first mismatch, or the bonus after a full accept)."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == target_argmax[accepted]:
        accepted += 1
    return accepted, target_argmax[accepted]


def rejection_accept(drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                     generator: torch.Generator | None) -> tuple[int, int]:
    """drafts [n], draft_probs [n, V], target_probs [n+1, V] -> (accepted m, next token).

    accept d_i with prob min(1, target_probs[i, d_i] / draft_probs[i, d_i]);
    on the first rejection, sample from norm(max(target_probs - draft_probs, 0));
    after a full accept, sample the bonus from target_probs[n].
    """
    n = drafts.shape[0]
    for i in range(n):
        d = int(drafts[i])
        u = torch.rand((), generator=generator, device=target_probs.device)
        if u * draft_probs[i, d] < target_probs[i, d]:
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0)
        total = residual.sum()
        residual = residual / total if total > 0 else target_probs[i]
        return i, int(sample_from(residual, generator))
    return n, int(sample_from(target_probs[n], generator))
