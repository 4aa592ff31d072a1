"""Drafter training losses on one teacher-forced block (DFlash and the DeepSpec DSpark recipe).

An example is an anchor position s of a teacher sequence x: context = taps of x[:s], block
= [x_s, mask, ...]; the slot predicting position t is labelled x_t, and the target's own
distribution there is p_t = softmax(target_logits[t - 1]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ..models.drafter import BlockDrafter


@dataclass
class Block:
    hidden: torch.Tensor          # [n, D] draft-slot hidden states
    labels: torch.Tensor          # [n] teacher tokens at the predicted positions
    prev: torch.Tensor            # [n] the true previous token (teacher-forced Markov input)
    target_logits: torch.Tensor   # [n, V] the target's logits for those positions


def block_at(drafter: BlockDrafter, taps: torch.Tensor, target_logits: torch.Tensor, seq: torch.Tensor,
             anchor: int) -> Block | None:
    """taps [1, L, F], target_logits [L, V], seq [L] -> the block anchored at `anchor` (None if empty)."""
    cfg = drafter.config
    first = 0 if cfg.shift_label else 1
    positions = torch.arange(cfg.num_draft_tokens) + anchor + 1          # positions the drafts predict
    positions = positions[positions < seq.shape[0]]
    if positions.numel() == 0:
        return None
    cache = drafter.new_cache(1, anchor + cfg.block_size)
    drafter.extend_context(taps[:, :anchor], cache)
    hidden = drafter.block_hidden(seq[anchor:anchor + 1], cfg.block_size, cache)[0]
    hidden = hidden[first:first + positions.numel()]
    return Block(hidden, seq[positions], seq[positions - 1], target_logits[positions - 1])


def dflash_loss(drafter: BlockDrafter, block: Block, gamma: float = 4.0) -> dict:
    """Cross-entropy per slot, weighted exp(-(k-1)/gamma) for slot k = 1..n."""
    logits = drafter.logits(block.hidden).float()
    w = torch.tensor([math.exp(-k / gamma) for k in range(len(block.labels))])
    loss = (F.cross_entropy(logits, block.labels, reduction="none") * w).sum() / w.sum()
    return {"loss": loss, "ce": loss.detach()}


def dspark_loss(drafter: BlockDrafter, block: Block, ce_alpha: float = 0.1, l1_alpha: float = 0.9,
                conf_alpha: float = 1.0) -> dict:
    """DeepSpec: 0.1 CE + 0.9 L1(softmax(z), p) with z = logits + W2(W1[prev]) (teacher-forced),
    position weights exp(-k/4); the confidence head regresses (BCE) onto 1 - ½‖softmax(z) - p‖₁."""
    bias, embed = drafter.markov_head(block.prev)
    z = drafter.logits(block.hidden).float() + bias                            # [n, V]
    p = torch.softmax(block.target_logits.float(), dim=-1)
    w = torch.tensor([math.exp(-k / 4) for k in range(len(block.labels))])
    ce = F.cross_entropy(z, block.labels, reduction="none")
    l1 = (torch.softmax(z, dim=-1) - p).abs().sum(-1)                          # in [0, 2]
    loss = ((ce_alpha * ce + l1_alpha * l1) * w).sum() / w.sum()
    out = {"ce": (ce * w).sum().detach() / w.sum(), "l1": (l1 * w).sum().detach() / w.sum()}
    if drafter.config.enable_confidence_head:
        conf = drafter.confidence_head(block.hidden, embed if drafter.config.confidence_head_with_markov else None)
        goal = (1 - 0.5 * l1).detach().clamp(0, 1)
        bce = F.binary_cross_entropy_with_logits(conf, goal)
        loss = loss + conf_alpha * bce
        out["confidence_bce"] = bce.detach()
    out["loss"] = loss
    return out
