"""DFlash (z-lab): one block pass, each slot's argmax (or sample) is its draft.

Published as `DFlashDraftModel` with a nested `dflash_config` (vLLM speculators: `DFlashSpeculator`);
taps are Hugging Face `hidden_states`; slot 0 is the anchor, so a block of B drafts B - 1 tokens.
"""

from __future__ import annotations

import torch

from ..layers.vocab import argmax_ids
from ..sampling.params import SamplingParams
from ..sampling.probs import sample_from, sampling_probs
from ..spec_decode.proposal import Proposal
from .kind import DrafterKind, Training

NAME = "dflash"


def propose(drafter, hidden: torch.Tensor, anchor: torch.Tensor, params: SamplingParams,
            generator: torch.Generator | None) -> Proposal:
    """Draft-slot hidden [b, n, D] -> each slot's argmax (greedy) or a draw from its distribution."""
    logits = drafter.logits(hidden)                                                   # [b, n, Vd]
    probs = None if params.greedy else sampling_probs(logits, params)
    tokens = argmax_ids(logits) if probs is None else sample_from(probs, generator)
    return Proposal(drafter.to_target(tokens), None if probs is None else drafter.to_target_vocab(probs))


def published(cfg) -> dict:
    """z-lab's layout: the drafter keys nested under `dflash_config`."""
    return {"architectures": ["DFlashDraftModel"],
            "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)}}


def _loss(drafter, block, gamma: float):
    from ..train.losses import dflash_loss        # training code loads only when a drafter trains

    return dflash_loss(drafter, block, gamma=gamma)


KIND = DrafterKind(
    name=NAME, title="DFlash",
    architectures=("DFlashDraftModel", "DFlashSpeculator"),
    shift_label=False, tap_point="hidden_states",
    check=lambda cfg: None,
    add_heads=lambda drafter, cfg: None,
    propose=propose,
    publish=published,
    hosts_projectors=True,
    training=Training(_loss),
)
