"""Tasks the TP tests run on every rank (a module of its own so spawned workers can import it)."""

import os

import torch

from blockdraft.drafters.dspark import MarkovHead, ShardedMarkovHead, dspark_lattice, markov_chain
from blockdraft.parallel.layers import TPGroup, shard_topk
from blockdraft.sampling.params import SamplingParams


def markov_case(vocab: int = 16, rank: int = 4, seed: int = 0):
    """A Markov head and slot logits with ties planted: slot 0's maximum is shared by ids 7 and 8
    (the last id of shard 0 and the first of shard 1 at TP=2), slot 1's by ids 3 and 5 (one shard)."""
    g = torch.Generator().manual_seed(seed)
    head = MarkovHead(vocab, rank)
    with torch.no_grad():
        head.markov_w1.weight.copy_(torch.randn(vocab, rank, generator=g))
        head.markov_w2.weight.zero_()                     # bias 0: the planted ties survive the bias
    logits = torch.randn(1, 3, vocab, generator=g)
    logits[0, 0, 7] = logits[0, 0, 8] = logits[0, 0].max() + 1.0
    logits[0, 1, 3] = logits[0, 1, 5] = logits[0, 1].max() + 1.0
    return head, logits


def chain_task(tp: TPGroup, payload):
    """Greedy and seeded sampled chains, sharded (logits and W2 split by vocab) vs full, plus the lattice."""
    vocab, with_bias = payload
    head, logits = markov_case(vocab)
    if with_bias:
        with torch.no_grad():
            head.markov_w2.weight.copy_(torch.randn(vocab, head.markov_w2.in_features,
                                                    generator=torch.Generator().manual_seed(3)))
    anchor = torch.tensor([2])
    sharded = ShardedMarkovHead(head, tp)
    local = logits[..., sharded.lo:sharded.hi]
    out = {}
    for name, params in (("greedy", SamplingParams()), ("sampled", SamplingParams(temperature=0.8, seed=11))):
        full_tokens = markov_chain(logits, anchor, head, params, params.generator())[0]
        shard_tokens = markov_chain(local, anchor, sharded, params, params.generator())[0]
        out[name] = (full_tokens.tolist(), shard_tokens.tolist())
    full_lat = dspark_lattice(logits, anchor, head, 4)
    shard_lat = dspark_lattice(local, anchor, sharded, 4)
    out["lattice_ids"] = (full_lat.candidate_ids.tolist(), shard_lat.candidate_ids.tolist())
    out["lattice_scores_diff"] = float((full_lat.scores - shard_lat.scores).abs().max())
    values, ids = shard_topk(local[0, 0], 3, sharded.lo, tp)
    out["topk_slot0"] = ids.tolist()
    return out


def die_task(tp: TPGroup, payload):
    if tp.rank == 1:
        os._exit(3)                                      # a worker that dies mid-run
    torch.distributed.barrier()                          # rank 0 would wait here forever without the launcher
    return "unreachable"


def topk_task(tp: TPGroup, x):
    lo, hi = tp.split(x.shape[-1])
    return shard_topk(x[..., lo:hi], 6, lo, tp)[1]
