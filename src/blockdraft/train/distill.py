"""Teacher-forced block losses for distilling a drafter from its target.

Data are the target's own continuations with their taps. One example is an
anchor position s: the context is the taps of tokens [0, s), the block is
`[x_s, mask, ...]`, and slot i's label is x_{s+i} (x_{s+i+1} with shift_label).
DSpark slots see the true previous token through the Markov head (teacher
forcing). Loss weights decay with the slot: exp(-(k-1)/gamma).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..models.drafter import BlockDrafter
from ..models.target import TargetModel


@torch.no_grad()
def teacher_sequences(target: TargetModel, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Greedy continuations of the target (the drafter's training text)."""
    from ..decode import generate_one
    from ..sampling.params import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    return [p + generate_one(target, p, params).token_ids for p in prompts]


def block_loss(drafter: BlockDrafter, taps: torch.Tensor, seq: torch.Tensor, anchor_pos: int,
               gamma: float = 4.0) -> torch.Tensor:
    """CE over the block slots for one anchor. taps [1, L, taps*H], seq [L]."""
    cfg = drafter.config
    first = 0 if cfg.shift_label else 1
    labels_at = torch.arange(cfg.num_draft_tokens) + anchor_pos + 1          # positions predicted
    valid = labels_at < seq.shape[0]
    if not valid.any():
        return taps.new_zeros(())
    cache = drafter.new_cache(1, anchor_pos + cfg.block_size)
    drafter.extend_context(taps[:, :anchor_pos], cache)
    hidden = drafter.block_hidden(seq[anchor_pos:anchor_pos + 1], cfg.block_size, cache)
    hidden = hidden[:, first:first + cfg.num_draft_tokens][:, valid]
    logits = drafter.logits(hidden)[0].float()                               # [n, V]
    labels = seq[labels_at[valid]]
    if cfg.kind == "dspark":
        prev = seq[labels_at[valid] - 1]                                     # teacher-forced predecessor
        logits = logits + drafter.markov_head(prev)[0]
    weights = torch.tensor([math.exp(-k / gamma) for k in range(len(labels))])
    return (F.cross_entropy(logits, labels, reduction="none") * weights).sum() / weights.sum()


def distill(drafter: BlockDrafter, target: TargetModel, sequences: list[list[int]], steps: int,
            lr: float = 3e-3, anchors_per_step: int = 8, seed: int = 0) -> list[float]:
    """A few hundred Adam steps of block CE; returns the loss curve."""
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in drafter.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=lr)
    with torch.no_grad():
        data = [(torch.tensor(s), target(torch.tensor([s]), tap_layers=drafter.config.target_layer_ids).taps)
                for s in sequences]
    losses = []
    drafter.train()
    for _ in range(steps):
        opt.zero_grad()
        total = 0.0
        for _ in range(anchors_per_step):
            seq, taps = data[int(torch.randint(len(data), (1,), generator=gen))]
            pos = int(torch.randint(1, len(seq) - 1, (1,), generator=gen))
            loss = block_loss(drafter, taps, seq, pos) / anchors_per_step
            loss.backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total)
    drafter.eval().requires_grad_(False)
    return losses
