"""Propose: one drafter pass → n draft tokens (and the distributions they came from).

DFlash: each slot's argmax / sample. DFlash2: walk its candidate lattice.
DSpark: full-vocabulary Markov chain, `logits_i += W2(W1[prev_i])`, prev_0 = anchor,
prev_i = d_i; the confidence head may cut the block (never changes the output).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.vocab import argmax_ids
from ..models.drafter import BlockDrafter, MarkovHead
from ..sampling.params import SamplingParams
from ..sampling.probs import sample_from, sampling_probs
from .lattice import dflash2_lattice, walk


@dataclass
class Proposal:
    tokens: torch.Tensor                  # [batch, n] drafts d_1..d_n
    draft_probs: torch.Tensor | None      # [batch, n, vocab] what each draft was sampled from (None: greedy)
    confidence: torch.Tensor | None = None  # [batch, n] P(slot accepted), DSpark only

    def truncated(self, n: int) -> "Proposal":
        cut = (lambda t: None if t is None else t[:, :n])
        return Proposal(self.tokens[:, :n], cut(self.draft_probs), cut(self.confidence))


def markov_chain(logits: torch.Tensor, anchor: torch.Tensor, head: MarkovHead, params: SamplingParams,
                 generator: torch.Generator | None, to_target=None):
    """Chained DSpark proposal over the full (draft) vocabulary. Returns target-id tokens [b, n],
    probs over the draft vocabulary, W1 embeds [b, n, r]. `to_target` maps draft ids to target ids
    (a pruned vocabulary); each slot's W1 is read at the previous token's target id.

    `head.vocab` says how `logits` and the bias are laid out: under tensor parallelism they are
    this rank's vocabulary shard, the argmax is global (ties → lowest id) and sampling draws from
    the gathered distribution, so every rank picks what a single process would.
    """
    ops = head.vocab
    prev, tokens, probs, embeds = anchor, [], [], []
    for i in range(logits.shape[1]):
        bias, embed = head(prev)
        slot_logits = logits[:, i].float() + bias                    # [b, vocab] (or [b, vocab / tp])
        if params.greedy:
            prev = ops.argmax(slot_logits)
        else:
            probs.append(sampling_probs(ops.gather(slot_logits), params))
            prev = sample_from(probs[-1], generator)
        if to_target is not None:
            prev = to_target(prev)
        tokens.append(prev)
        embeds.append(embed)
    return torch.stack(tokens, 1), (torch.stack(probs, 1) if probs else None), torch.stack(embeds, 1)


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
    cfg = drafter.config
    # [b, n, V]; a vocab-sharded DSpark head (TP) reads only this rank's logit shard
    logits = drafter.logits(hidden, shard=cfg.kind == "dspark" and drafter.markov_head.vocab.sharded)
    if cfg.kind == "dflash":
        probs = None if params.greedy else sampling_probs(logits, params)
        tokens = argmax_ids(logits) if probs is None else sample_from(probs, generator)
        return Proposal(drafter.to_target(tokens), _target_probs(drafter, probs))
    if cfg.kind == "dflash2":
        lattice = dflash2_lattice(logits, hidden, anchor, drafter.candidate_selector, drafter.to_target)
        tokens, probs = walk(lattice, params, generator, cfg.vocab_size)
        return Proposal(tokens, probs)
    to_target = drafter.to_target if cfg.pruned_vocab else None
    tokens, probs, embeds = markov_chain(logits, anchor, drafter.markov_head, params, generator, to_target)
    probs = _target_probs(drafter, probs)
    confidence = None
    if cfg.enable_confidence_head:
        conf_logits = drafter.confidence_head(hidden, embeds if cfg.confidence_head_with_markov else None)
        confidence = torch.sigmoid(conf_logits)
    return Proposal(tokens, probs, confidence)


def _target_probs(drafter: BlockDrafter, probs: torch.Tensor | None) -> torch.Tensor | None:
    """Draft-vocabulary distributions [b, n, Vd] -> over target ids [b, n, V] (zero off the draft vocabulary)."""
    return None if probs is None else drafter.to_target_vocab(probs)
