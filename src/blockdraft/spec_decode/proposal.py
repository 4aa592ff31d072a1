"""What one drafter pass proposes: draft tokens, the distributions they were drawn from, their confidence."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Proposal:
    tokens: torch.Tensor                  # [batch, n] drafts d_1..d_n
    draft_probs: torch.Tensor | None      # [batch, n, vocab] what each draft was sampled from (None: greedy)
    confidence: torch.Tensor | None = None  # [batch, n] P(slot accepted), where the kind estimates it

    def truncated(self, n: int) -> "Proposal":
        cut = (lambda t: None if t is None else t[:, :n])
        return Proposal(self.tokens[:, :n], cut(self.draft_probs), cut(self.confidence))
