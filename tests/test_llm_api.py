"""The vLLM-style Python surface: LLM, SamplingParams, outputs; tokenizer and stop strings."""

import pytest
import torch

import blockdraft
from blockdraft.errors import ConfigError, RequestError
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


def test_context_limit_is_the_models_or_the_users_not_4096(tmp_path):
    """No silent 4096 cap: the model's max_position_embeddings (or `max_model_len`) bounds a request, and
    `max_model_len_source` says which; the default cache still holds max_batch sequences of a sensible
    length (not max_batch full-length ones) and at least one full-length sequence."""
    import json
    import shutil

    long = tmp_path / "long"
    shutil.copytree(ASSETS / "target-qwen3", long)
    config = json.loads((long / "config.json").read_text())
    (long / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16384}))
    llm = blockdraft.LLM(target=long, drafter=ASSETS / "dspark", max_batch=8)
    assert llm.engine.max_model_len == 16384
    assert llm.max_model_len == 16384 and "max_position_embeddings" in llm.max_model_len_source
    rid = llm.engine.add_request(list(range(3, 100)) * 100, blockdraft.SamplingParams(max_tokens=6000))
    llm.engine.abort(rid)                      # 15700 tokens admitted; not run
    plan = llm.engine.plan
    assert 16384 < plan.num_blocks * plan.page_size < 8 * 16384
    mine = blockdraft.LLM(target=long, drafter="none", max_model_len=1024, max_batch=2)
    assert mine.max_model_len == 1024 and mine.max_model_len_source == "max_model_len"
    with pytest.raises(RequestError, match="context"):
        mine.engine.add_request([5] * 1000, blockdraft.SamplingParams(max_tokens=100))


def test_share_target_runs_the_same_weights_with_its_own_drafter(llm):
    """`share_target`: a second LLM over the first one's target tensors (not a copy), with its own drafter
    and engine, decoding what a separately loaded LLM decodes; another target's numerics are refused by name."""
    plain = blockdraft.LLM(target=ASSETS / "target-qwen3", drafter=None, max_batch=4, share_target=llm)
    assert plain.target is llm.target and plain.drafter is None and llm.drafter is not None
    assert plain.engine is not llm.engine
    alone = blockdraft.LLM(target=ASSETS / "target-qwen3", drafter=None, max_batch=4)
    params = blockdraft.SamplingParams(max_tokens=12, ignore_eos=True)
    assert plain.generate(["abc"], params)[0].token_ids == alone.generate(["abc"], params)[0].token_ids
    other = "float32" if llm.target.dtype == torch.bfloat16 else "bfloat16"
    with pytest.raises(ConfigError, match=f"share_target: dtype torch.{other} asked.*dtype {llm.target.dtype}"):
        blockdraft.LLM(target=ASSETS / "target-qwen3", drafter=None, dtype=other, share_target=llm)
