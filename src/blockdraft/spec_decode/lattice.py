"""Candidate lattice (ORT-GenAI contract) and the walk over it.

`candidate_ids` int64 [batch, n, K]: the top-K base draft logits per slot (sorted,
best first, equal logits in ascending id order), as each drafter kind that has a lattice
builds it (`drafters/dspark.py`, `drafters/dflash2.py`). `scores` fp32 [batch, n, K, K]:
`scores[b, i, p, j]` = base logit of candidate j at slot i + edge(candidate p of
slot i-1 → candidate j of slot i);
slot 0's predecessor is the anchor, so its K rows are equal. Edge math is fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling.params import SamplingParams
from ..sampling.probs import sample_from


@dataclass
class Lattice:
    candidate_ids: torch.Tensor  # [batch, n, K] int64
    scores: torch.Tensor         # [batch, n, K, K] fp32


def predecessors(anchor: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """[b], [b, n, K] -> predecessor ids [b, n, K]: the anchor for slot 0, slot i-1's candidates after."""
    first = anchor[:, None, None].expand(-1, 1, candidates.shape[-1])
    return torch.cat([first, candidates[:, :-1]], dim=1)


def walk(lattice: Lattice, params: SamplingParams, generator: torch.Generator | None,
         vocab_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Walk from the anchor, carrying the chosen index. Returns drafts [b, n] and, when sampling,
    the full-vocabulary distribution each draft was drawn from [b, n, V] (the `q` for rejection)."""
    cand, scores = lattice.candidate_ids, lattice.scores
    b, n, k = cand.shape
    rows = torch.arange(b, device=cand.device)
    index = torch.zeros(b, dtype=torch.long, device=cand.device)  # slot 0: all rows are equal
    picks, q_rows = [], []
    for i in range(n):
        row = scores[rows, i, index]                                  # [b, K]
        if params.greedy:
            index = row.argmax(dim=-1)
        else:
            q = torch.softmax(row / params.temperature, dim=-1)
            index = sample_from(q, generator)
            q_rows.append(torch.zeros(b, vocab_size, device=q.device).scatter_add(-1, cand[:, i], q))
        picks.append(cand[rows, i, index])
    drafts = torch.stack(picks, dim=1)
    return drafts, (torch.stack(q_rows, dim=1) if q_rows else None)
