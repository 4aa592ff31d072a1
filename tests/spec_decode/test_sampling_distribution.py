"""Rejection sampling is lossless in distribution: a chi-square test on a tiny vocabulary.

For a fixed prompt we draw many (t0, t1, t2) with one speculative step producing
t1, t2 from 2 drafts, and compare their joint frequencies with the target's exact
probabilities p(t0) p(t1|t0) p(t2|t0,t1), computed by brute force.
"""

import pytest
from scipy.stats import chisquare

from decode_oracle import generate_one
from blockdraft.sampling.params import SamplingParams
from blockdraft.sampling.probs import sampling_probs
from tiny_models import tiny_pair

SAMPLES = 2000


def exact_joint(target, prompt, params):
    vocab = target.config.vocab_size
    probs = {}
    p0 = sampling_probs(target.logits([prompt])[0, -1], params)
    for t0 in range(vocab):
        if p0[t0] == 0:
            continue
        p1 = sampling_probs(target.logits([prompt + [t0]])[0, -1], params)
        both = sampling_probs(target.logits([[*prompt, t0, t1] for t1 in range(vocab)])[:, -1], params)
        for t1 in range(vocab):
            for t2 in range(vocab):
                probs[(t0, t1, t2)] = float(p0[t0] * p1[t1] * both[t1, t2])
    return probs


@pytest.mark.parametrize("kind,params", [
    ("dflash", SamplingParams(max_tokens=3, temperature=1.0)),
    ("dflash2", SamplingParams(max_tokens=3, temperature=0.6, top_k=4)),
    ("dspark", SamplingParams(max_tokens=3, temperature=1.3, top_p=0.8)),
    ("dspark", SamplingParams(max_tokens=3, temperature=1.0)),
], ids=["dflash-t1", "dflash2-t0.6-topk4", "dspark-t1.3-topp0.8", "dspark-t1"])
def test_speculative_sampling_matches_target_distribution(kind, params):
    target, drafter = tiny_pair(kind)
    pvalue, accepted_any = sampled_vs_exact(target, drafter, [1, 5, 2, 7], params)
    assert accepted_any > SAMPLES // 10, "drafts were almost never accepted: the test would not exercise acceptance"
    assert pvalue > 1e-3


def sampled_vs_exact(target, drafter, prompt, params) -> tuple[float, int]:
    """SAMPLES seeded speculative runs of 3 tokens -> (chi-square p-value of their joint frequencies
    against the target's exact joint, runs whose first step accepted a draft)."""
    expected = exact_joint(target, prompt, params)
    counts = dict.fromkeys(expected, 0)
    accepted_any = 0
    for s in range(SAMPLES):
        gen = generate_one(target, prompt, SamplingParams(**{**params.__dict__, "seed": s}), drafter)
        counts[tuple(gen.token_ids)] += 1
        accepted_any += gen.acceptance_lengths[0] > 1
    # pool cells with small expectation so the chi-square approximation holds
    big = [k for k, p in expected.items() if p * SAMPLES >= 5]
    small = [k for k in expected if k not in big]
    observed = [counts[k] for k in big] + [sum(counts[k] for k in small)]
    exp = [expected[k] * SAMPLES for k in big] + [sum(expected[k] for k in small) * SAMPLES]
    scale = sum(observed) / sum(exp)
    return chisquare(observed, [e * scale for e in exp]).pvalue, accepted_any


def test_seeded_sampling_is_reproducible():
    target, drafter = tiny_pair("dspark")
    params = SamplingParams(max_tokens=12, temperature=0.9, seed=123)
    a = generate_one(target, [3, 1, 4], params, drafter)
    b = generate_one(target, [3, 1, 4], params, drafter)
    assert a.token_ids == b.token_ids and a.acceptance_lengths == b.acceptance_lengths
