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


@pytest.mark.parametrize("threshold", [0.2, 0.5, 0.9])
def test_confidence_threshold_cuts_blocks_never_the_output(target, drafters, ar_outputs, threshold):
    """In the oracle and in the engine: the same tokens as plain decoding, and fewer drafts than the full
    block (the threshold did cut blocks)."""
    from blockdraft.engine.engine import EngineConfig, LLMEngine, default_cache_budget

    for prompt, ref in zip(PROMPTS[:3], ar_outputs):
        gen = generate_one(target, prompt, SamplingParams(max_tokens=33), drafters["dspark"],
                           confidence_threshold=threshold)
        assert gen.token_ids == ref
    drafted = {}
    for t in (0.0, threshold):
        config = EngineConfig(max_batch=3, confidence_threshold=t, adaptive_speculation=False,
                              cache_budget_bytes=default_cache_budget(target, drafters["dspark"], 512, 3))
        outs = LLMEngine(target, drafters["dspark"], config).generate(PROMPTS[:3], SamplingParams(max_tokens=33))
        assert [o.token_ids for o in outs] == ar_outputs[:3]
        drafted[t] = sum(o.drafted for o in outs)
    assert drafted[threshold] < drafted[0.0], f"threshold {threshold} never cut a block: {drafted}"


def test_stop_inside_accepted_run_truncates(target, drafters, ar_outputs):
    """A stop token committed as an accepted draft (not the last token of its step): output ends there,
    like plain decoding. Every drafter must meet such a case, or the test says so."""
    for name in DRAFTER_NAMES:
        for prompt, ref in zip(PROMPTS, ar_outputs):
            full = generate_one(target, prompt, SamplingParams(max_tokens=33), drafters[name])
            drafts, first = [], 1                 # token 0 comes from the prefill; each step adds `al`
            for al in full.acceptance_lengths:
                drafts += range(first, first + al - 1)        # accepted drafts of this step
                first += al
            stops = [i for i in drafts if ref.index(ref[i]) == i]   # its first occurrence: the stop fires there
            if not stops:
                continue
            stop_at = stops[0]
            gen = generate_one(target, prompt, SamplingParams(max_tokens=33), drafters[name],
                               StopCriteria(eos_ids=frozenset([ref[stop_at]])))
            assert gen.token_ids == ref[: stop_at + 1] and gen.finish_reason == "stop"
            assert sum(gen.acceptance_lengths) < sum(full.acceptance_lengths[:len(gen.acceptance_lengths)])
            break
        else:
            pytest.fail(f"{name}: no prompt commits a first-seen token as an accepted draft; the check is vacuous")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_temperature_zero_ignores_seed(target, drafters, ar_outputs, seed):
    gen = generate_one(target, PROMPTS[1], SamplingParams(max_tokens=33, seed=seed), drafters["dspark"])
    assert gen.token_ids == ar_outputs[1]
