"""The vLLM-style Python surface: LLM, SamplingParams, outputs; tokenizer and stop strings."""

import pytest
import torch

import blockdraft
from blockdraft.errors import RequestError
from conftest import ASSETS


@pytest.fixture(scope="module")
def llm():
    return blockdraft.LLM(target=ASSETS / "target-qwen3", drafter=ASSETS / "dspark", max_batch=4)


def test_generate_text_and_ids(llm):
    params = blockdraft.SamplingParams(max_tokens=16, ignore_eos=True)
    by_text = llm.generate(["Hello world"], sampling_params=params)[0]
    ids = llm.tokenizer.encode("Hello world")
    by_ids = llm.generate(prompt_token_ids=[ids], sampling_params=params)[0]
    assert by_text.token_ids == by_ids.token_ids and len(by_text.token_ids) == 16
    assert by_text.text == llm.tokenizer.decode(by_text.token_ids)
    assert sum(by_text.acceptance_lengths) == 15 and by_text.finish_reason == "length"


def test_stop_string_cuts_text_and_stops(llm):
    params = blockdraft.SamplingParams(max_tokens=30, ignore_eos=True)
    full = llm.generate(["abc"], params)[0]
    stop = full.text[8:10]
    assert stop.strip(), "need a visible stop string"
    out = llm.generate(["abc"], blockdraft.SamplingParams(max_tokens=30, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop" and stop not in out.text and full.text.startswith(out.text)
    assert len(out.token_ids) < len(full.token_ids)


def test_eos_stops_unless_ignored(llm):
    """Generation ends at the first EOS id (kept as the last token) unless ignore_eos."""
    assert llm.tokenizer.eos_token_id in llm._eos_ids()
    full = llm.generate(["abc"], blockdraft.SamplingParams(max_tokens=30, ignore_eos=True))[0].token_ids
    eos = full[len(full) // 2]                      # pretend a mid-run token is the model's EOS
    cut = full.index(eos)
    saved = llm.engine.eos_ids
    llm.engine.eos_ids = frozenset({eos})
    try:
        stopped = llm.generate(["abc"], blockdraft.SamplingParams(max_tokens=30))[0]
        ignored = llm.generate(["abc"], blockdraft.SamplingParams(max_tokens=30, ignore_eos=True))[0]
    finally:
        llm.engine.eos_ids = saved
    assert stopped.finish_reason == "stop" and stopped.token_ids == full[:cut + 1]
    assert ignored.token_ids == full and ignored.finish_reason == "length"


def test_load_target_and_logits_surface():
    target = blockdraft.load_target(ASSETS / "target-qwen3")
    logits = target.logits([[1, 2, 3], [4, 5, 6]])
    assert logits.shape == (2, 3, 128) and logits.dtype == torch.float32
    drafter = blockdraft.load_drafter(ASSETS / "dflash", target)
    assert drafter.config.kind == "dflash"


def test_invalid_requests(llm):
    with pytest.raises(RequestError, match="exactly one of"):
        llm.generate()
    with pytest.raises(RequestError, match="prompt is empty"):
        llm.generate(prompt_token_ids=[[]])
    with pytest.raises(RequestError, match="top_k must be"):
        blockdraft.SamplingParams(top_k=-1)


def test_import_is_light():
    import subprocess
    import sys
    code = "import sys, blockdraft; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    assert out == "False"


def test_batched_generate_equals_single_stream(llm):
    from decode_oracle import generate_one
    from conftest import random_prompts

    prompts = random_prompts(10, seed=8)
    params = blockdraft.SamplingParams(max_tokens=20, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    for p, o in zip(prompts, outs):
        assert o.token_ids == generate_one(llm.target, p, params, llm.drafter).token_ids
    assert llm.engine.blocks.num_free == llm.engine.plan.num_blocks
