"""Speculative greedy output equals plain greedy decoding of the target, for every drafter kind."""

import pytest

from decode_oracle import generate_one
from blockdraft.loading import load_drafter
from blockdraft.sampling.params import SamplingParams
from blockdraft.sampling.stops import StopCriteria
from conftest import ASSETS, DRAFTER_NAMES, random_prompts

PROMPTS = random_prompts(6, seed=11)


@pytest.fixture(scope="module")
def ar_outputs(target):
    return [generate_one(target, p, SamplingParams(max_tokens=33)).token_ids for p in PROMPTS]


@pytest.mark.parametrize("name", DRAFTER_NAMES)
def test_greedy_spec_equals_autoregressive(target, drafters, ar_outputs, name):
    lengths = []
    for prompt, ref in zip(PROMPTS, ar_outputs):
        gen = generate_one(target, prompt, SamplingParams(max_tokens=33), drafters[name])
        assert gen.token_ids == ref
        assert sum(gen.acceptance_lengths) == len(gen.token_ids) - 1
        lengths += gen.acceptance_lengths
    assert max(lengths) > 1, "the fixture drafter never got a draft accepted: the comparison is vacuous"


@pytest.mark.parametrize("name", ["dflash", "dflash2", "dspark"])
@pytest.mark.parametrize("max_tokens", [1, 2, 3, 7])
def test_budget_edges(target, drafters, name, max_tokens):
    """Near max_tokens the block shrinks (DFlash) or is cut (DSpark); never a token past the budget."""
    prompt = PROMPTS[0]
    ref = generate_one(target, prompt, SamplingParams(max_tokens=max_tokens)).token_ids
    gen = generate_one(target, prompt, SamplingParams(max_tokens=max_tokens), drafters[name])
    assert gen.token_ids == ref and len(ref) == max_tokens
    assert sum(gen.acceptance_lengths) == max_tokens - 1


@pytest.mark.parametrize("block_size", [2, 3, 9])
def test_block_size_override_stays_lossless(target, ar_outputs, block_size):
    drafter = load_drafter(ASSETS / "dflash2", target, block_size=block_size)
    for prompt, ref in zip(PROMPTS[:3], ar_outputs):
        assert generate_one(target, prompt, SamplingParams(max_tokens=33), drafter).token_ids == ref


@pytest.mark.parametrize("threshold", [0.05, 0.5, 0.9])
def test_confidence_threshold_never_changes_output(target, drafters, ar_outputs, threshold):
    for prompt, ref in zip(PROMPTS[:3], ar_outputs):
        gen = generate_one(target, prompt, SamplingParams(max_tokens=33), drafters["dspark"],
                           confidence_threshold=threshold)
        assert gen.token_ids == ref


def test_stop_inside_accepted_run_truncates(target, drafters, ar_outputs):
    """The stop token is found inside a multi-token step: output ends there, like plain decoding."""
    for name in DRAFTER_NAMES:
        for prompt, ref in zip(PROMPTS, ar_outputs):
            full = generate_one(target, prompt, SamplingParams(max_tokens=33), drafters[name])
            ends, pos = [], 0
            for al in full.acceptance_lengths:
                pos += al
                if al > 1:
                    ends.append(pos - 1)  # second-to-last token of a multi-token step, as index into tokens
            if not ends:
                continue
            stop_at = ends[0]
            stop_id = ref[stop_at]
            first = ref.index(stop_id)
            gen = generate_one(target, prompt, SamplingParams(max_tokens=33), drafters[name],
                               StopCriteria(eos_ids=frozenset([stop_id])))
            assert gen.token_ids == ref[: first + 1] and gen.finish_reason == "stop"
            break


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_temperature_zero_ignores_seed(target, drafters, ar_outputs, seed):
    gen = generate_one(target, PROMPTS[1], SamplingParams(max_tokens=33, seed=seed), drafters["dspark"])
    assert gen.token_ids == ar_outputs[1]
