"""The candidate lattice contract, and the DSpark lattice walk equal to the full Markov chain.

Base top-K alone loses the full-vocabulary chain wherever the Markov bias moves the argmax
out of it; the lattice therefore always holds the greedy chain's token (last place when the
top-K lacks it), and the greedy walk equals the chain at every K.
"""

import pytest
import torch

from blockdraft.sampling.params import SamplingParams
from blockdraft.drafters.dspark import dspark_lattice, markov_chain
from blockdraft.spec_decode.lattice import walk
from conftest import random_prompts


def block_logits(target, drafter, prompt):
    out = target(torch.tensor([prompt]), tap_layers=drafter.config.target_layer_ids)
    anchor = out.logits[0, -1].argmax().view(1)
    cache = drafter.new_cache()
    drafter.extend_context(out.taps, cache)
    return anchor, drafter.logits(drafter.block_hidden(anchor, drafter.config.block_size, cache))


def test_lattice_shapes_dtypes_and_slot0_rows(target, drafters):
    drafter = drafters["dspark"]
    anchor, logits = block_logits(target, drafter, [5, 6, 7, 8])
    lat = dspark_lattice(logits.to(torch.bfloat16), anchor, drafter.markov_head, k=4)
    n = drafter.config.block_size
    assert lat.candidate_ids.dtype == torch.int64 and lat.candidate_ids.shape == (1, n, 4)
    assert lat.scores.dtype == torch.float32 and lat.scores.shape == (1, n, 4, 4)
    assert torch.equal(lat.scores[0, 0], lat.scores[0, 0, :1].expand(4, 4))  # anchor predecessor: rows equal
    # an entry is base logit + W1[pred] . W2[cand], in fp32
    w1, w2 = drafter.markov_head.markov_w1.weight.float(), drafter.markov_head.markov_w2.weight.float()
    pred, cand = lat.candidate_ids[0, 1, 2], lat.candidate_ids[0, 2, 3]
    expected = logits.to(torch.bfloat16)[0, 2, cand].float() + w1[pred] @ w2[cand]
    assert torch.allclose(lat.scores[0, 2, 2, 3], expected, atol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 4, 16, 128])
def test_walk_equals_chain_at_every_k(target, drafters, k):
    drafter = drafters["dspark"]
    outside_base_top_k = 0
    for prompt in random_prompts(30, seed=k):
        anchor, logits = block_logits(target, drafter, prompt)
        chain, _, _ = markov_chain(logits, anchor, drafter.markov_head, SamplingParams(), None)
        lat = dspark_lattice(logits, anchor, drafter.markov_head, k)
        walked, _ = walk(lat, SamplingParams(), None, drafter.config.vocab_size)
        assert torch.equal(walked, chain)
        assert bool((lat.candidate_ids[0] == chain[0][:, None]).any(-1).all())      # the chain is in the set
        base = logits[0].float().topk(k, dim=-1).indices                             # [n, K]
        outside_base_top_k += int((~(base == chain[0][:, None]).any(-1)).sum())
    if k == 1:
        assert outside_base_top_k > 0, "K=1 should expose the Markov bias moving the argmax"
