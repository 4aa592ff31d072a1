"""Propose: one drafter pass → n draft tokens (and the distributions they came from).

Which rows of the block predict drafts is shared by every kind (`block_rows`, `draft_slots`); how tokens
are chosen from them is the drafter kind's rule (`drafters/`): DFlash takes each slot's argmax, DFlash2
walks its candidate lattice, DSpark chains its Markov head (and its confidence head may cut the block,
never changing the output).
"""

from __future__ import annotations

import torch

from ..drafters.registry import drafter_kind
from ..models.drafter import BlockDrafter
from ..sampling.params import SamplingParams
from .lattice import Lattice
from .proposal import Proposal


def block_rows(drafter: BlockDrafter, n_drafts: int) -> int:
    """Query rows of the drafter pass. shift_label: the block is always full (slot i predicts
    start+i+1); otherwise slot 0 is the anchor and the block shrinks near the budget so
    nothing past it is drafted (as dflash_generate does)."""
    cfg = drafter.config
    return cfg.block_size if cfg.shift_label else n_drafts + 1


def draft_slots(drafter: BlockDrafter, hidden: torch.Tensor, n_drafts: int) -> torch.Tensor:
    """Block hidden [b, rows, D] -> the rows that predict drafts d_1..d_n [b, n, D]."""
    first = 0 if drafter.config.shift_label else 1
    return hidden[:, first:first + n_drafts]


def confident_prefix(proposal: Proposal, threshold: float) -> list[int]:
    """Per row: drafts kept when the block is cut at the first slot with P(accept) < threshold."""
    b, n = proposal.tokens.shape
    if proposal.confidence is None or threshold <= 0:
        return [n] * b
    return (proposal.confidence >= threshold).int().cumprod(-1).sum(-1).tolist()


def choose_drafts(drafter: BlockDrafter, hidden: torch.Tensor, anchor: torch.Tensor, params: SamplingParams,
                  generator: torch.Generator | None) -> Proposal:
    """Draft-slot hidden [b, n, D] -> tokens, by the drafter kind's rule."""
    return drafter_kind(drafter.config.kind).propose(drafter, hidden, anchor, params, generator)


def block_lattice(drafter: BlockDrafter, hidden: torch.Tensor, anchor: torch.Tensor, top_k: int) -> Lattice:
    """Block hidden [b, rows, D] -> the candidate lattice of the drafter's kind (one that has a lattice)."""
    slots = draft_slots(drafter, hidden, drafter.config.num_draft_tokens)               # [b, n, D]
    logits = drafter.logits(slots)                                                      # [b, n, V]
    return drafter_kind(drafter.config.kind).lattice(drafter, slots, logits, anchor, top_k)
