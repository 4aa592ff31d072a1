"""Drafter training losses on teacher-forced blocks (DFlash and the DeepSpec DSpark recipe).

An example is an anchor position s of a teacher sequence x: context = taps of x[:s], block
= [x_s, mask, ...]; the slot predicting position t is labelled x_t, and the target's own
distribution there is p_t = softmax(lm_head(final_hidden[t - 1])). Many anchors of one
sequence are built at once: the context K/V are projected once and each anchor's block
reads them through a `ContextRead` whose validity mask stops at that anchor — the same
attention path inference takes, so training sees exactly what the runtime computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ..errors import ConfigError
from ..layers.linear import StableLinear
from ..models.drafter import BlockDrafter
from ..layers.vocab import FULL
from ..spec_decode.propose import draft_slots
from ..cache.views import ContextRead
from .head_loss import draft_head_loss


@dataclass
class TopK:
    """The target's next-token distribution kept on its k likeliest ids (the rest of the mass,
    1 - probs.sum(-1), is spread over ids it does not name)."""
    ids: torch.Tensor                    # [N, k] target ids
    probs: torch.Tensor                  # [N, k] float32 probabilities, descending


@dataclass
class Block:
    hidden: torch.Tensor                 # [N, D] draft-slot hidden states (N = anchors × slots, flattened)
    labels: torch.Tensor                 # [N] teacher tokens at the predicted positions
    prev: torch.Tensor                   # [N] the true previous token (teacher-forced Markov input)
    slot: torch.Tensor                   # [N] slot index k = 0.. within its block
    weight: torch.Tensor                 # [N] 0 for slots past the sequence end, else 1
    target_logits: torch.Tensor | None   # [N, V] the target's logits for those positions (DSpark only)
    target_topk: TopK | None = None      # or its top-k distribution there (the teacher cache)


def context_read(drafter: BlockDrafter, taps: torch.Tensor, anchors: torch.Tensor) -> ContextRead:
    """taps [1, L, F] of a whole sequence, anchors [M] -> each anchor's context = rows [0, anchor)."""
    n, m = taps.shape[1], anchors.shape[0]
    positions = torch.arange(n)
    ctx = drafter.hidden_norm(drafter.fc(taps.to(drafter.dtype)))                  # [1, L, D]
    cos, sin = drafter.rotary.cos_sin(positions[None], drafter.dtype)
    keys, values = [], []
    for layer in drafter.layers:
        k, v = layer.self_attn.context_kv(ctx, cos, sin)                            # [1, hkv, L, d]
        keys.append(k.expand(m, -1, -1, -1))
        values.append(v.expand(m, -1, -1, -1))
    valid = positions[None, :] < anchors[:, None]                                   # [M, L]
    layers = len(drafter.layers)
    return ContextRead(keys, values, [positions[None].expand(m, -1)] * layers, [valid] * layers, anchors)


def blocks_at(drafter: BlockDrafter, taps: torch.Tensor, final: torch.Tensor | None, seq: torch.Tensor,
              anchors: torch.Tensor, head: torch.nn.Linear | None = None) -> Block:
    """taps [1, L, F], final [L, H] (the target's post-norm hidden), seq [L], anchors [M] -> flattened blocks.

    `head` (the target's LM head) turns `final` into target logits; only DSpark's loss needs them.
    """
    cfg = drafter.config
    n = cfg.num_draft_tokens
    hidden = drafter.block_hidden(seq[anchors], cfg.block_size, context_read(drafter, taps, anchors))
    hidden = draft_slots(drafter, hidden, n)                                        # [M, n, D]
    positions = anchors[:, None] + 1 + torch.arange(n)                              # [M, n] predicted positions
    weight = (positions < seq.shape[0]).float()
    positions = positions.clamp(max=seq.shape[0] - 1)
    target_logits = None
    if head is not None and final is not None:
        with torch.no_grad():        # anchors' blocks overlap: each position's logits once
            rows, back = torch.unique(positions - 1, return_inverse=True)
            target_logits = head(final[rows].to(head.weight.dtype)).float()                 # [rows, V]
            cap = drafter.shared.logit_softcap       # the target's distribution is over its capped logits
            if cap is not None:
                target_logits = torch.tanh(target_logits / cap) * cap
            target_logits = target_logits[back.reshape(-1)]                                # [M * n, V]
    return Block(hidden.reshape(-1, hidden.shape[-1]), seq[positions].reshape(-1), seq[positions - 1].reshape(-1),
                 torch.arange(n).repeat(anchors.shape[0]), weight.reshape(-1), target_logits)


def with_topk(block: Block, anchors: torch.Tensor, seq_len: int, topk_ids: torch.Tensor,
              topk_probs: torch.Tensor) -> Block:
    """`block` (built by `blocks_at` for `anchors`) with the target's top-k distribution at each slot's
    position: topk_ids / topk_probs [L, k], row t = the distribution of position t + 1."""
    n = block.hidden.shape[0] // anchors.shape[0]
    rows = ((anchors[:, None] + 1 + torch.arange(n)).clamp(max=seq_len - 1) - 1).reshape(-1)     # [M * n]
    return Block(block.hidden, block.labels, block.prev, block.slot, block.weight, None,
                 TopK(topk_ids[rows].long(), topk_probs[rows].float()))


def topk_l1(drafter: BlockDrafter, draft_probs: torch.Tensor, topk: TopK) -> torch.Tensor:
    """‖draft_probs − target_probs‖₁ per row [N] with the target known on its top-k ids only.

    On the named ids the terms are exact; an id the draft vocabulary lacks contributes its target
    probability (the drafter puts 0 there); the mass off the top-k, target r and draft q_rest,
    contributes |q_rest − r| — the least the unnamed ids can add, exact when the drafter is on one
    side of the target over all of them, never more than 2·min(q_rest, r) short. With k = V it
    is the exact L1."""
    ids = drafter.to_draft(topk.ids)                                                        # [N, k], -1: not drafted
    named = ids >= 0
    draft_on_top = draft_probs.gather(1, ids.clamp_min(0)) * named                          # [N, k]
    on_top = ((draft_on_top - topk.probs).abs() * named).sum(-1)
    off_vocab = (topk.probs * ~named).sum(-1)
    draft_rest = (1 - draft_on_top.sum(-1)).clamp_min(0)
    target_rest = (1 - topk.probs.sum(-1)).clamp_min(0)
    return on_top + off_vocab + (draft_rest - target_rest).abs()


def _weighted(values: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (values * w).sum() / w.sum().clamp_min(1e-6)


def _draft_labels(drafter: BlockDrafter, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Target-id labels -> draft-vocabulary labels and a mask of those the draft vocabulary holds
    (a pruned drafter cannot propose the others: they carry no cross-entropy)."""
    ids = drafter.to_draft(labels)
    return ids.clamp_min(0), (ids >= 0).float()


def dflash_loss(drafter: BlockDrafter, block: Block, gamma: float = 4.0) -> dict:
    """Cross-entropy per slot, weighted exp(-(k-1)/gamma) for slot k = 1..n (gamma = inf: uniform)."""
    logits = drafter.logits(block.hidden).float()                              # [N, Vd]
    labels, covered = _draft_labels(drafter, block.labels)
    w = torch.exp(-block.slot.float() / gamma) * block.weight * covered
    loss = _weighted(F.cross_entropy(logits, labels, reduction="none"), w)
    return {"loss": loss, "ce": loss.detach()}


def dspark_loss(drafter: BlockDrafter, block: Block, ce_alpha: float = 0.1, l1_alpha: float = 0.9,
                conf_alpha: float = 1.0, gamma: float = 4.0) -> dict:
    """DeepSpec: 0.1 CE + 0.9 L1(softmax(z), p) with z = logits + W2(W1[prev]) (teacher-forced),
    position weights exp(-k/gamma); the confidence head regresses (BCE) onto 1 - ½‖softmax(z) - p‖₁."""
    if block.target_logits is None and block.target_topk is None:
        raise ConfigError("dspark_loss needs the target's distribution: build the block with head=target.lm_head "
                          "or from the teacher cache (with_topk)")
    w = torch.exp(-block.slot.float() / gamma) * block.weight
    labels, covered = _draft_labels(drafter, block.labels)
    head = drafter.lm_head if drafter.config.own_lm_head else drafter.shared.lm_head
    if block.target_topk is not None and _plain_head(drafter, head):     # the chunked pass (head_loss.py)
        embed = drafter.markov_head.markov_w1(block.prev)
        loss, ce, l1 = draft_head_loss(block.hidden, head.weight, embed, drafter.markov_head.markov_w2.weight,
                                       labels, covered, drafter.to_draft(block.target_topk.ids),
                                       block.target_topk.probs, w, ce_alpha, l1_alpha, *_product_dtypes(head))
        return _with_confidence(drafter, block, embed, loss, ce, l1, w, conf_alpha)
    bias, embed = drafter.markov_head(block.prev)
    z = drafter.logits(block.hidden).float() + bias                            # [N, Vd]
    log_q = F.log_softmax(z, dim=-1)                                           # [N, Vd]; CE and q from one pass
    ce = -log_q.gather(1, labels[:, None])[:, 0] * covered
    q = log_q.exp()
    if block.target_topk is not None:
        l1 = topk_l1(drafter, q, block.target_topk)                            # [N] in [0, 2]
    else:
        p = torch.softmax(block.target_logits, dim=-1)                         # [N, V]
        outside = 0.0
        if drafter.config.pruned_vocab:  # q is 0 off the draft vocabulary: that part of |q - p| is p's mass there
            p = p[:, drafter.to_target(torch.arange(z.shape[-1]))]
            outside = (1 - p.sum(-1)).clamp_min(0)
        l1 = (q - p).abs().sum(-1) + outside                                   # in [0, 2]
    return _with_confidence(drafter, block, embed, _weighted(ce_alpha * ce + l1_alpha * l1, w), ce, l1, w, conf_alpha)


def _plain_head(drafter: BlockDrafter, head) -> bool:
    """Whether the draft logits are head(hidden) alone (no multiplier, cap or vocabulary shard) on the
    CPU: then `draft_head_loss` computes the DSpark loss."""
    c = drafter.config
    return (type(head) in (torch.nn.Linear, StableLinear) and head.bias is None and c.output_multiplier == 1.0
            and not c.final_logit_softcapping and drafter.markov_head.vocab is FULL and head.weight.device.type == "cpu")


def _product_dtypes(head) -> tuple[torch.dtype, torch.dtype]:
    """The dtypes the LM head's and the Markov bias's products run in, as the reference path runs them:
    bf16 under autocast; else the head's weight dtype and fp32."""
    if torch.is_autocast_enabled("cpu"):
        return torch.bfloat16, torch.bfloat16
    return head.weight.dtype, torch.float32


def _with_confidence(drafter: BlockDrafter, block: Block, embed: torch.Tensor, loss: torch.Tensor, ce: torch.Tensor,
                     l1: torch.Tensor, w: torch.Tensor, conf_alpha: float) -> dict:
    """The loss parts, plus the confidence head's BCE towards 1 - ½ L1 where the drafter has one."""
    out = {"ce": _weighted(ce, w).detach(), "l1": _weighted(l1, w).detach()}
    heads = drafter.config.heads
    if heads.enable_confidence_head:
        conf = drafter.confidence_head(block.hidden, embed if heads.confidence_head_with_markov else None)
        goal = (1 - 0.5 * l1).detach().clamp(0, 1)
        bce = _weighted(F.binary_cross_entropy_with_logits(conf, goal, reduction="none"), block.weight)
        loss = loss + conf_alpha * bce
        out["confidence_bce"] = bce.detach()
    out["loss"] = loss
    return out
