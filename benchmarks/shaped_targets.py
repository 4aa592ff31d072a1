"""Random targets in published families' shapes, for the benchmarks that time passes no shipped
checkpoint gives (`bench_costs.py`, `bench_moe_width.py`, `bench_spec.py`): the configs, the model built
from one (bf16, seeded), and one timed pass plus state commit that leaves the cache as it found it."""

from __future__ import annotations

import time

import torch


def _layer_types(n: int, full_every: int, state: str, full_at: tuple[int, ...] = ()) -> tuple[str, ...]:
    return tuple("full_attention" if (i + 1) % full_every == 0 or i in full_at else state for i in range(n))


def shaped_configs() -> dict:
    """Random models with a published family's layer pattern and head geometry (no checkpoint ships):
    SmolLM2-135M's (the default model: Llama, 30 layers, 576 wide); Qwen3.5 at a small width (18 Gated DeltaNet + 6 gated-attention layers); LFM2-1.2B as published
    (10 short-conv + 6 attention layers); LFM2-8B-A1B's MoE (32 experts, top-4, sigmoid router, 2 dense
    layers) at half its width and depth, so that it fits beside the others in memory; gpt-oss-20b's MoE (32
    experts, top-4, biases, clamped SwiGLU; sliding window 128 on every other layer, sinks) at 1024 wide and
    8 deep; Gemma 4 26B-A4B's (128 experts, top-8 beside a GeGLU MLP; 5:1 sliding/full, full layers with
    their own head geometry and V = K) at 1024 wide and 12 deep."""
    from blockdraft.config import DeltaNetConfig, MoeConfig, RopeConfig, ShortConvConfig, TargetConfig
    lfm2_full = (2, 5, 8, 10, 12, 14)
    return {
        "smollm2": TargetConfig(       # the default model's shape (SmolLM2-135M), for targets built at random
            architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
            num_heads=9, num_kv_heads=3, head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
            tie_word_embeddings=True),
        "qwen3.5": TargetConfig(
            architecture="qwen3_5", vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_layers=24,
            num_heads=8, num_kv_heads=2, head_dim=256, max_position_embeddings=4096, qk_norm=True,
            layer_types=_layer_types(24, 4, "linear_attention"),
            deltanet=DeltaNetConfig(num_k_heads=16, num_v_heads=16, k_dim=128, v_dim=128, conv_kernel=4),
            partial_rotary_factor=0.25, attn_output_gate=True, norm_offset=True),
        "lfm2": TargetConfig(
            architecture="lfm2", vocab_size=65536, hidden_size=2048, intermediate_size=8192, num_layers=16,
            num_heads=32, num_kv_heads=8, head_dim=64, max_position_embeddings=4096, qk_norm=True,
            tie_word_embeddings=True, layer_types=_layer_types(16, 10 ** 6, "short_conv", lfm2_full),
            short_conv=ShortConvConfig(conv_dim=2048, conv_kernel=3)),
        "lfm2-moe": TargetConfig(
            architecture="lfm2_moe", vocab_size=65536, hidden_size=1024, intermediate_size=3584, num_layers=12,
            num_heads=16, num_kv_heads=4, head_dim=64, max_position_embeddings=4096, qk_norm=True,
            tie_word_embeddings=True, layer_types=_layer_types(12, 10 ** 6, "short_conv", (2, 5, 8, 10)),
            short_conv=ShortConvConfig(conv_dim=1024, conv_kernel=3),
            moe=MoeConfig(num_experts=32, top_k=4, expert_intermediate_size=896, router="sigmoid",
                          expert_bias=True, dense_layers=2)),
        "gpt-oss": TargetConfig(
            architecture="gpt_oss", vocab_size=65536, hidden_size=1024, intermediate_size=1024, num_layers=8,
            num_heads=16, num_kv_heads=4, head_dim=64, max_position_embeddings=4096, attention_bias=True,
            layer_types=("sliding_attention", "full_attention") * 4, sliding_window=128, attention_sinks=True,
            moe=MoeConfig(num_experts=32, top_k=4, expert_intermediate_size=1024, router="topk_softmax",
                          biases=True, activation="clamped_swiglu")),
        "gemma4-moe": TargetConfig(
            architecture="gemma4", vocab_size=65536, hidden_size=1024, intermediate_size=768, num_layers=12,
            num_heads=8, num_kv_heads=4, head_dim=128, max_position_embeddings=4096, qk_norm=True,
            tie_word_embeddings=True, layer_types=_layer_types(12, 6, "sliding_attention"), sliding_window=128,
            global_head_dim=256, global_kv_heads=2, attention_k_eq_v=True, hidden_act="gelu_tanh",
            global_rope=RopeConfig(theta=1e6, rope_type="proportional", partial_rotary_factor=0.25),
            final_logit_softcapping=30.0,
            moe=MoeConfig(num_experts=128, top_k=8, expert_intermediate_size=256, router="normed_softmax",
                          activation="gelu_tanh")),
    }


def shaped(cfg):
    """A bf16 TargetModel of `cfg`, its weights drawn from N(0, 0.02) under seed 0."""
    from blockdraft.models.target import TargetModel
    torch.manual_seed(0)
    with torch.device("meta"):
        model = TargetModel(cfg)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
        for name, b in model.named_buffers():     # to_empty left them unset: routing biases 0, layer scalars 1
            b.fill_(1.0 if name.endswith("layer_scalar") else 0.0)
    model.tie_weights()
    return model.to(torch.bfloat16).eval().requires_grad_(False)


def hybrid_step(t, cache, ids: torch.Tensor, context: int, keep: int) -> float:
    """Time one pass over ids plus the commit of `keep` rows; then put the state and length back."""
    pool = cache.states
    state = [*pool.windows.values(), *pool.rec.values()]
    saved = [x.clone() for x in state]
    t0 = time.perf_counter()
    t(ids, cache)
    cache.truncate(context + keep)
    spent = time.perf_counter() - t0
    for x, y in zip(state, saved):
        x.copy_(y)
    cache.length = context
    return spent
