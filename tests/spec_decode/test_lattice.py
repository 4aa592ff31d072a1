"""The candidate lattice contract, and when the DSpark lattice walk equals the full Markov chain.

The greedy walk only sees the top-K base candidates per slot. It equals the
full-vocabulary chain whenever the chain's token is inside the top-K at every
slot; at the first slot where the chain's token lies outside the top-K the walk
necessarily picks something else (and everything after may differ).
"""

import pytest
import torch

from blockdraft.sampling.params import SamplingParams
from blockdraft.spec_decode.lattice import dspark_lattice, walk
from blockdraft.spec_decode.propose import markov_chain
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
def test_walk_equals_chain_exactly_when_chain_stays_in_top_k(target, drafters, k):
    drafter = drafters["dspark"]
    equal_cases = differing_cases = 0
    for prompt in random_prompts(30, seed=k):
        anchor, logits = block_logits(target, drafter, prompt)
        chain, _, _ = markov_chain(logits, anchor, drafter.markov_head, SamplingParams(), None)
        lat = dspark_lattice(logits, anchor, drafter.markov_head, k)
        walked, _ = walk(lat, SamplingParams(), None, drafter.config.vocab_size)
        inside = (lat.candidate_ids[0] == chain[0][:, None]).any(-1)             # [n]
        first_out = int((~inside).nonzero()[0]) if not inside.all() else None
        if first_out is None:
            assert torch.equal(walked, chain)
            equal_cases += 1
        else:  # identical up to the first slot that leaves the top-K, different there
            assert torch.equal(walked[0, :first_out], chain[0, :first_out])
            assert walked[0, first_out] != chain[0, first_out]
            differing_cases += 1
    if k == 128:
        assert differing_cases == 0
    if k == 1:
        assert differing_cases > 0, "K=1 should expose the Markov bias moving the argmax"
    assert equal_cases + differing_cases == 30
