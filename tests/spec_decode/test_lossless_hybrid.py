"""Speculative decoding on Qwen3.5 hybrid targets is lossless, in the batch engine.

Drafters distilled on the tiny target's own text partly agree with it (acceptance lengths between 1
and the block). In bf16 (row-invariant kernels, one per-token DeltaNet recurrence for every row):
speculative greedy output equals plain decoding token for token at batch 1 and 8 with mixed prompt
lengths and after preemption, and per-step acceptance lengths equal a cache-free loop that recomputes
the whole sequence each step. Sampling: the chi-square test of the dense targets.
"""

from pathlib import Path

import pytest
import hybrid_models as hm
from blockdraft.loading import load_target
from decode_oracle import generate_cache_free
from blockdraft.engine.engine import EngineConfig, LLMEngine
from blockdraft.errors import ConfigError
from blockdraft.sampling.params import SamplingParams
from spec_decode.test_sampling_distribution import SAMPLES, sampled_vs_exact
from tiny_models import tiny_hybrid_pair

GREEDY = SamplingParams(max_tokens=16, ignore_eos=True)


def _engine(target, drafter, max_batch=8, budget=4 << 20, **kw) -> LLMEngine:
    return LLMEngine(target, drafter, EngineConfig(max_batch=max_batch, cache_budget_bytes=budget, max_model_len=128,
                                                   adaptive_speculation=False, **kw))


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_speculative_equals_plain_and_the_cache_free_loop(hybrid_root, kind, moe):
    target, drafter = hm.load_pair(hybrid_root, kind, moe)
    prompts = hm.prompts(8, seed=11, low=3, high=40)              # mixed lengths, batched together
    plain = _engine(target, None).generate(prompts, GREEDY)
    batched = _engine(target, drafter).generate(prompts, GREEDY)
    alone = _engine(target, drafter, max_batch=1).generate(prompts[:2], GREEDY)
    als = [a for o in batched for a in o.acceptance_lengths]
    assert 1 < sum(als) / len(als) < drafter.config.num_draft_tokens + 1, "drafts must be partly accepted"
    for i, (p, o) in enumerate(zip(prompts, batched)):
        assert o.token_ids == plain[i].token_ids, f"prompt {i}"
        if i < 2:
            oracle = generate_cache_free(target, p, GREEDY.max_tokens, drafter)
            assert o.token_ids == oracle.token_ids
            assert o.acceptance_lengths == oracle.acceptance_lengths, f"prompt {i}"
    for o, ref in zip(alone, batched):
        assert (o.token_ids, o.acceptance_lengths) == (ref.token_ids, ref.acceptance_lengths)


def test_int4_speculative_equals_plain_int4(hybrid_root):
    """Lossless against the quantized model (a different model from the bf16 one), batched."""
    from blockdraft.loading import load_drafter, load_target
    target = load_target(hm.checkpoint(str(hybrid_root)), dtype="bfloat16", quantization="int4")
    drafter = load_drafter(hm.trained_drafter_dir(str(hybrid_root), "dspark"), target)
    prompts = hm.prompts(8, seed=12, low=3, high=30)
    plain = _engine(target, None).generate(prompts, GREEDY)
    spec = _engine(target, drafter).generate(prompts, GREEDY)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert max(a for o in spec for a in o.acceptance_lengths) > 1


@pytest.mark.parametrize("rollback", ["replay", "per_row"])
def test_preemption_recomputes_the_state_and_loses_nothing(hybrid_root, rollback):
    target, drafter = hm.load_pair(hybrid_root, "dspark")
    prompts = hm.prompts(6, seed=5, low=20, high=40)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    plain = _engine(target, None).generate(prompts, params)
    engine = _engine(target, drafter, max_batch=6, budget=170_000, state_rollback=rollback)
    out = engine.generate(prompts, params)
    assert engine.scheduler.preemptions > 0, "the budget must force preemption"
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]
    assert engine.runner.states.num_free == engine.runner.states.num_slots     # every slot back
    assert engine.blocks.num_free == engine.plan.num_blocks


def test_prefix_caching_is_refused_by_name(hybrid_root):
    target, drafter = hm.load_pair(hybrid_root, "dflash")
    engine = _engine(target, drafter)
    assert "refused for qwen3_5" in engine.prefix_caching_off and "recurrent state" in engine.prefix_caching_off
    prompt = hm.prompts(1, seed=2, low=40, high=41)[0]
    first, second = engine.generate([prompt, prompt], GREEDY)
    assert engine.stats.prefix_hits == 0
    assert first.token_ids == second.token_ids


def test_state_is_billed_per_batch_row(hybrid_root):
    target, _ = hm.load_pair(hybrid_root, None)
    small, big = _engine(target, None, max_batch=1).plan, _engine(target, None, max_batch=8).plan
    assert small.state_bytes > 0 and big.state_bytes == 8 * small.state_bytes
    assert big.num_blocks < small.num_blocks                       # the same budget holds fewer KV pages
    with pytest.raises(ConfigError, match="drafter reserve and recurrent state of"):
        _engine(target, None, max_batch=8, budget=big.state_bytes)


@pytest.mark.parametrize("arch, moe", [("gpt_oss", False), ("gemma4", True)], ids=["gpt_oss", "gemma4"])
def test_sliding_layers_are_billed_their_window_and_full_layers_their_pages(hybrid_root, arch, moe):
    """From the checkpoint's config.json: each sliding layer that keeps its own K/V holds W-1 rows of
    K ‖ V per sequence (billed for every batch row); only full layers that keep their own K/V get pages,
    at the full layers' geometry (Gemma 4: `per_layer_config`). What is billed is what is allocated."""
    import json
    source = Path(hm.checkpoint(str(hybrid_root), moe, arch=arch))
    target = load_target(source, dtype="bfloat16")
    cfg = json.loads((source / "config.json").read_text())
    layers, window = cfg["num_hidden_layers"], cfg["sliding_window"]
    own = range(layers - (cfg.get("num_kv_shared_layers") or 0))              # layers that keep their own K/V
    full_geometry = next(iter((cfg.get("per_layer_config") or {}).values()), {})
    kv_heads, head_dim = cfg["num_key_value_heads"], cfg["head_dim"]
    sliding = [i for i in own if cfg["layer_types"][i] == "sliding_attention"]
    full = [i for i in own if cfg["layer_types"][i] == "full_attention"]
    per_row = len(sliding) * (window - 1) * 2 * kv_heads * head_dim * 2       # bf16
    engine = _engine(target, None, max_batch=3)
    assert engine.plan.state_bytes == 3 * per_row
    states = engine.runner.states
    assert sorted(states.windows) == sliding
    assert sum(t.numel() * t.element_size() for t in states.windows.values()) == 3 * per_row
    pool = engine.runner.target_pool
    assert sorted(pool.k) == full
    geometry = (full_geometry.get("num_key_value_heads", kv_heads), full_geometry.get("head_dim", head_dim))
    assert all(t.shape[1:] == geometry for t in [*pool.k.values(), *pool.v.values()])
    assert engine.plan.target_bytes_per_block == len(full) * 2 * engine.plan.page_size * geometry[0] * geometry[1] * 2


def test_speculative_sampling_matches_the_hybrid_target_distribution():
    """Temperature 1, top-p 0.8, DSpark (the dense targets' test covers every drafter kind)."""
    params = SamplingParams(max_tokens=3, temperature=1.0, top_p=0.8)
    target, drafter = tiny_hybrid_pair("dspark")
    pvalue, accepted_any = sampled_vs_exact(target, drafter, [1, 5, 2, 7], params)
    assert accepted_any > SAMPLES // 20, "drafts were almost never accepted: the test would not exercise acceptance"
    assert pvalue > 1e-3
