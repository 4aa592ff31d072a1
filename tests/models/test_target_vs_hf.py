"""Target logits and greedy continuations equal transformers' on the same random weights (fp32)."""

import zlib

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from decode_oracle import generate_one
from blockdraft.loading import load_target
from blockdraft.sampling.params import SamplingParams

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=3, max_position_embeddings=256,
            rms_norm_eps=1e-6)

CASES = {
    "qwen3-gqa2": (Qwen3Config, Qwen3ForCausalLM, dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    "qwen3-mqa-tied": (Qwen3Config, Qwen3ForCausalLM, dict(num_attention_heads=4, num_key_value_heads=1,
                                                            head_dim=32, tie_word_embeddings=True)),
    "qwen3-mha-yarn": (Qwen3Config, Qwen3ForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=4, head_dim=16,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64})),
    "llama-smollm-style": (LlamaConfig, LlamaForCausalLM, dict(
        num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
    "llama3-scaling-bias": (LlamaConfig, LlamaForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "llama-linear": (LlamaConfig, LlamaForCausalLM, dict(
        num_attention_heads=4, num_key_value_heads=4,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    cfg_cls, model_cls, extra = CASES[request.param]
    torch.manual_seed(zlib.crc32(request.param.encode()))
    hf = model_cls(cfg_cls(**BASE, **extra)).eval()
    with torch.no_grad():  # HF init leaves norms at 1; perturb so a wrong norm shows up
        for name, p in hf.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path_factory.mktemp(request.param)
    shard = "20KB" if request.param == "qwen3-gqa2" else "1GB"  # one case loads from a sharded index
    hf.save_pretrained(path, max_shard_size=shard)
    return hf, load_target(path), request.param


@pytest.mark.parametrize("shape", [(1, 7), (2, 33), (3, 100)])
def test_logits_match_transformers(pair, shape):
    hf, ours, _ = pair
    ids = torch.randint(0, BASE["vocab_size"], shape, generator=torch.Generator().manual_seed(shape[1]))
    with torch.no_grad():
        ref = hf(ids).logits
    assert (ours.logits(ids) - ref).abs().max().item() <= 1e-4


def test_taps_are_hf_hidden_states(pair):
    hf, ours, _ = pair
    ids = torch.randint(0, BASE["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True).hidden_states
    layers = (0, 2)  # 2 is the last layer: HF's value there is after the final norm
    taps = ours(ids, tap_layers=layers).taps
    expected = torch.cat([ref[i + 1] for i in layers], dim=-1)
    assert (taps - expected).abs().max().item() <= 1e-4


def test_incremental_cache_matches_full_pass(pair):
    _, ours, _ = pair
    ids = torch.randint(0, BASE["vocab_size"], (1, 24), generator=torch.Generator().manual_seed(2))
    full = ours.logits(ids)
    cache = ours.new_cache(1, capacity=4)  # forces growth
    parts = []
    with torch.no_grad():
        for lo, hi in [(0, 10), (10, 11), (11, 24)]:
            parts.append(ours(ids[:, lo:hi], cache).logits)
            cache.truncate(hi)
    assert (torch.cat(parts, 1) - full).abs().max().item() <= 1e-4


def test_rollback_then_rewrite(pair):
    """A rejected block is overwritten: truncate + rewrite gives the same logits as never writing it."""
    _, ours, _ = pair
    ids = torch.randint(0, BASE["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(3))
    junk = torch.randint(0, BASE["vocab_size"], (1, 5), generator=torch.Generator().manual_seed(4))
    cache = ours.new_cache(1)
    with torch.no_grad():
        ours(ids[:, :10], cache)
        cache.truncate(10)
        ours(junk, cache)          # speculative rows
        cache.truncate(10)         # rejected
        after = ours(ids[:, 10:], cache).logits
    assert (after - ours.logits(ids)[:, 10:]).abs().max().item() <= 1e-4


def test_greedy_continuation_matches_transformers_generate(pair):
    hf, ours, _ = pair
    prompt = torch.randint(0, BASE["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hf.generation_config.eos_token_id = None  # EOS is an ordinary token here, as with ignore_eos
        ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False,
                          pad_token_id=0)[0, 9:].tolist()
    got = generate_one(ours, prompt[0].tolist(), SamplingParams(max_tokens=24, ignore_eos=True)).token_ids
    assert got == ref
