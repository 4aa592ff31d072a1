"""Candidate lattice (ORT-GenAI contract) and the walk over it.

`candidate_ids` int64 [batch, n, K]: the top-K base draft logits per slot (sorted,
best first, equal logits in ascending id order); for DSpark the greedy full-vocabulary
chain's token replaces the last one when the top-K lacks it. `scores` fp32 [batch, n, K, K]:
`scores[b, i, p, j]` = base logit of candidate j at slot i + edge(candidate p of
slot i-1 → candidate j of slot i);
slot 0's predecessor is the anchor, so its K rows are equal. Edge math is fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ..models.drafter import CandidateSelector, MarkovHead
from ..sampling.params import SamplingParams
from ..sampling.probs import sample_from
from ..layers.linear import fp32_weight
from ..layers.vocab import topk_lowest_id


@dataclass
class Lattice:
    candidate_ids: torch.Tensor  # [batch, n, K] int64
    scores: torch.Tensor         # [batch, n, K, K] fp32


def _predecessors(anchor: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """[b], [b, n, K] -> predecessor ids [b, n, K]: the anchor for slot 0, slot i-1's candidates after."""
    first = anchor[:, None, None].expand(-1, 1, candidates.shape[-1])
    return torch.cat([first, candidates[:, :-1]], dim=1)


def dspark_lattice(logits: torch.Tensor, anchor: torch.Tensor, head: MarkovHead, k: int,
                   to_target=None) -> Lattice:
    """logits [b, n, V] (before the Markov bias) -> lattice with edges W1[pred] · W2[cand].

    The K candidates of a slot are the top-K base logits, except that the token of the greedy
    full-vocabulary Markov chain always takes the last place when the top-K lacks it: the chain
    is n small matmuls, and with its token present the greedy walk (which, having followed the
    chain to slot i-1, scores slot i's candidates exactly as the chain scores the vocabulary)
    picks the chain at every K. Base top-K alone loses the chain whenever the Markov bias moves
    the argmax (measured on a bias-dominated drafter: acceptance 1.3 at K=8 against 4.5 for the
    chain).

    With a pruned vocabulary, logits and W2 rows are draft ids; `to_target` maps the candidates
    to the target ids the lattice carries (and W1 reads).

    Under tensor parallelism (`head.vocab` a shard, `logits` this rank's shard) the top-K is
    global, the chain's argmax is global, and each rank scores the candidates whose W2 rows it
    holds; one all-reduce sums them."""
    ops = head.vocab
    unary, cand = ops.topk(logits, k)                                     # [b, n, K]
    chain = greedy_chain(logits, anchor, head, to_target)                 # [b, n] draft ids
    missing = ~(cand == chain[..., None]).any(-1)                         # [b, n]
    chain_logit = ops.at(logits, chain)                                   # [b, n]
    cand = torch.cat([cand[..., :-1], torch.where(missing, chain, cand[..., -1])[..., None]], dim=-1)
    unary = torch.cat([unary[..., :-1], torch.where(missing, chain_logit, unary[..., -1])[..., None]], dim=-1)
    cand_ids = cand if to_target is None else to_target(cand)            # [b, n, K] target ids
    pred_embed = head.markov_w1(_predecessors(anchor, cand_ids)).float()  # [b, n, K, r]
    succ = ops.rows(head.markov_w2.weight, cand)                          # [b, n, K, r]
    edges = ops.reduce(torch.einsum("bipr,bijr->bipj", pred_embed, succ))
    return Lattice(cand_ids, unary[:, :, None, :] + edges)


def greedy_chain(logits: torch.Tensor, anchor: torch.Tensor, head: MarkovHead, to_target=None) -> torch.Tensor:
    """The greedy DSpark chain over the full (draft) vocabulary: [b, n] draft ids,
    d_i = argmax(logits_i + W2(W1[d_{i-1}])), d_0's predecessor the anchor."""
    prev, out = anchor, []
    for i in range(logits.shape[1]):
        bias, _ = head(prev)                                              # [b, V] (or this rank's shard)
        slot = logits[:, i].float() + bias
        pick = head.vocab.argmax(slot)              # vocab shards: a global argmax (ties -> lowest id)
        out.append(pick)
        prev = pick if to_target is None else to_target(pick)
    return torch.stack(out, dim=1)


def dflash2_lattice(logits: torch.Tensor, hidden: torch.Tensor, anchor: torch.Tensor,
                    selector: CandidateSelector, to_target=None) -> Lattice:
    """Edges (P[pred] ∘ proj(h_i)) · S[cand] as DFlash2's candidate selector defines them
    (codebooks are read at target ids; `to_target` maps a pruned vocabulary's candidates)."""
    unary, cand = topk_lowest_id(logits.float(), selector.top_k)
    if to_target is not None:
        cand = to_target(cand)
    proj = F.linear(hidden.float(), fp32_weight(selector.hidden_projection.weight))   # [b, n, r]
    pred_embed = selector.predecessor_codebook.weight[_predecessors(anchor, cand)].float() * proj[:, :, None]
    succ = selector.successor_codebook.weight[cand].float()
    edges = torch.einsum("bipr,bijr->bipj", pred_embed, succ)
    return Lattice(cand, unary[:, :, None, :] + edges)


def block_lattice(drafter, hidden: torch.Tensor, anchor: torch.Tensor, top_k: int) -> Lattice:
    """Block hidden [b, rows, D] of a DSpark or DFlash2 drafter -> its candidate lattice (DFlash2 uses
    its selector's own top-K)."""
    from .propose import draft_slots          # propose imports this module

    slots = draft_slots(drafter, hidden, drafter.config.num_draft_tokens)               # [b, n, D]
    logits = drafter.logits(slots)                                                      # [b, n, V]
    if drafter.config.kind == "dspark":
        return dspark_lattice(logits, anchor, drafter.markov_head, top_k, drafter.to_target)
    return dflash2_lattice(logits, slots, anchor, drafter.candidate_selector, drafter.to_target)


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
