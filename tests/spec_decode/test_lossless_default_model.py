"""Lossless on the default model in every numerics it runs in (bf16, and its weight-only int8 /
int4 forms: each against plain decoding of the same numerics), through the batch engine.

Real prompts are where a multi-row verify that rounds differently from one-row steps shows up as
a different token at a near-tie; the row-invariant kernels (`layers/linear.py`,
`layers/attention.py`, `layers/cpu_kernels.py`) are what keep them equal. Here: bench prompts, both
shipped drafters, greedy; and each request decoded alone equals the same request decoded beside
the others.
"""

import pytest

import blockdraft
from blockdraft.bench.prompt_sets import load_set

pytestmark = pytest.mark.slow

TOKENS = 32


@pytest.fixture(scope="module")
def prompts():
    return load_set("humaneval", 1) + load_set("chat", 1) + load_set("math", 1)


@pytest.fixture(scope="module", params=["none", "int8", "int4"])
def quant(request):
    return request.param


@pytest.fixture(scope="module")
def plain(prompts, quant):
    llm = blockdraft.LLM(drafter="none", dtype="bfloat16", quantization=quant, max_batch=1)
    return [o.token_ids for o in llm.generate(prompts, blockdraft.SamplingParams(max_tokens=TOKENS), chat=True)]


@pytest.mark.parametrize("drafter", ["dspark", "dflash"])
def test_speculative_equals_plain(prompts, plain, quant, drafter):
    llm = blockdraft.LLM(drafter=drafter, dtype="bfloat16", quantization=quant, max_batch=1,
                         adaptive_speculation=False)
    outs = llm.generate(prompts, blockdraft.SamplingParams(max_tokens=TOKENS), chat=True)
    assert [o.token_ids for o in outs] == plain
    assert any(a > 1 for o in outs for a in o.acceptance_lengths)


def test_batched_equals_alone(prompts, plain, quant):
    """The three requests side by side (ragged lengths, one batch) give each one's solo output,
    with the draft width chosen by measured cost (the default)."""
    llm = blockdraft.LLM(drafter="dspark", dtype="bfloat16", quantization=quant, max_batch=3)
    outs = llm.generate(prompts, blockdraft.SamplingParams(max_tokens=TOKENS), chat=True)
    assert [o.token_ids for o in outs] == plain


def test_numerics_are_reported(quant):
    """The numerics in use are reported; auto runs the default model at its GGUF's 4 bits where the own
    kernel builds (numerics.py), and bf16 where it does not or fp32 is asked for."""
    from blockdraft.layers import cpu_kernels

    llm = blockdraft.LLM(drafter="none", dtype="bfloat16", quantization=quant, max_batch=1)
    assert llm.numerics["quantization"] == quant and llm.numerics["dtype"] == "bfloat16"
    auto = blockdraft.LLM(drafter="none").numerics
    assert auto["quantization"] == ("int4" if cpu_kernels.available() else "none") and auto["dtype"] == "bfloat16"
    if cpu_kernels.available():
        assert auto["kernel"].startswith("qgemm")
    assert blockdraft.LLM(drafter="none", dtype="float32").numerics["quantization"] == "none"
