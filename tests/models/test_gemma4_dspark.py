"""DeepSpec's Gemma 4 DSpark drafter (`Gemma4DSparkModel`): Gemma-style blocks in the drafter — checked
against a block forward assembled from transformers' own Gemma 4 modules (the ones DeepSpec builds on)."""

import json

import pytest
import torch
from safetensors.torch import save_file
from torch.nn import functional as F

import hybrid_models as hm
from blockdraft.checkpoints.publish import save_drafter
from blockdraft.errors import ConfigError
from blockdraft.loading import load_drafter, load_target

H, LAYERS, BLOCK, RANK, TAPS = 64, 2, 4, 8, (1, 4)


def deepspec_config() -> dict:
    """A copy of the target's text config made a drafter, as DeepSpec's `build_draft_config` does."""
    cfg = hm.gemma4_text_config(True, num_hidden_layers=LAYERS, layer_types=["full_attention"] * LAYERS,
                                enable_moe_block=False, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
                                use_double_wide_mlp=False, num_experts=None, top_k_experts=None,
                                moe_intermediate_size=None)
    cfg.update(architectures=["Gemma4DSparkModel"], model_type="gemma4_text", block_size=BLOCK,
               mask_token_id=hm.VOCAB - 1, target_layer_ids=list(TAPS), num_target_layers=8, num_anchors=16,
               markov_rank=RANK, markov_head_type="vanilla", enable_confidence_head=True,
               confidence_head_with_markov=True)
    return cfg


def deepspec_drafter(root, seed: int = 3):
    path = root / "gemma4-dspark"
    if (path / "config.json").is_file():
        return path
    path.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.15, mean=0.0):
        return torch.randn(*shape, generator=g) * scale + mean
    d, kv, heads, inter = 32, 1, 4, 96
    t = {"embed_tokens.weight": rnd(hm.VOCAB, H, scale=1.0), "fc.weight": rnd(H, len(TAPS) * H),
         "hidden_norm.weight": rnd(H, mean=1.0, scale=0.3), "norm.weight": rnd(H, mean=1.0, scale=0.3),
         "lm_head.weight": rnd(hm.VOCAB, H, scale=0.5),
         "markov_head.markov_w1.weight": rnd(hm.VOCAB, RANK, scale=0.3),
         "markov_head.markov_w2.weight": rnd(hm.VOCAB, RANK, scale=0.3),
         "confidence_head.proj.weight": rnd(1, H + RANK, scale=0.1), "confidence_head.proj.bias": torch.zeros(1)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        t.update({p + "self_attn.q_proj.weight": rnd(heads * d, H), p + "self_attn.k_proj.weight": rnd(kv * d, H),
                  p + "self_attn.o_proj.weight": rnd(H, heads * d, scale=0.06),
                  p + "self_attn.q_norm.weight": rnd(d, mean=1.0, scale=0.3),
                  p + "self_attn.k_norm.weight": rnd(d, mean=1.0, scale=0.3),
                  p + "mlp.gate_proj.weight": rnd(inter, H), p + "mlp.up_proj.weight": rnd(inter, H),
                  p + "mlp.down_proj.weight": rnd(H, inter, scale=0.06), p + "layer_scalar": rnd(1, mean=1.0, scale=0.2),
                  **{p + f"{n}_layernorm.weight": rnd(H, mean=1.0, scale=0.3)
                     for n in ("input", "post_attention", "pre_feedforward", "post_feedforward")}})
    (path / "config.json").write_text(json.dumps(deepspec_config()))
    save_file(t, str(path / "model.safetensors"))
    return path


@torch.no_grad()
def reference_block_logits(path, taps: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """The DSpark backbone over [context ‖ block] (non-causal), built from transformers' Gemma 4 RMSNorm,
    GeGLU MLP, rotary embedding and rotation, with the checkpoint's tensors."""
    import transformers as tf
    from safetensors.torch import load_file
    from transformers.models.gemma4 import modeling_gemma4 as g4
    cfg = deepspec_config()
    text = tf.Gemma4TextConfig(**{k: v for k, v in cfg.items() if k not in (
        "architectures", "model_type", "block_size", "mask_token_id", "target_layer_ids", "num_target_layers",
        "num_anchors", "markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")})
    w = load_file(str(path / "model.safetensors"))
    eps = text.rms_norm_eps

    def norm(name, dim):
        n = g4.Gemma4RMSNorm(dim, eps=eps)
        n.weight.copy_(w[name])
        return n
    n_ctx, n_blk = taps.shape[1], block_ids.shape[1]
    ctx = norm("hidden_norm.weight", H)(F.linear(taps, w["fc.weight"]))
    x = F.embedding(block_ids, w["embed_tokens.weight"]) * torch.tensor(H ** 0.5)
    positions = torch.arange(n_ctx + n_blk)[None]
    cos, sin = g4.Gemma4TextRotaryEmbedding(text)(x, positions, layer_type="full_attention")
    for i in range(LAYERS):
        p = f"layers.{i}."
        h = norm(p + "input_layernorm.weight", H)(x)
        q = F.linear(h, w[p + "self_attn.q_proj.weight"]).view(1, n_blk, 4, 32)
        q = norm(p + "self_attn.q_norm.weight", 32)(q).transpose(1, 2)
        kv = F.linear(torch.cat([ctx, h], dim=1), w[p + "self_attn.k_proj.weight"]).view(1, n_ctx + n_blk, 1, 32)
        k = norm(p + "self_attn.k_norm.weight", 32)(kv).transpose(1, 2)
        v = g4.Gemma4RMSNorm(32, eps=eps, with_scale=False)(kv).transpose(1, 2)        # k_eq_v: V is K's projection
        q = g4.apply_rotary_pos_emb(q, cos[:, -n_blk:], sin[:, -n_blk:], unsqueeze_dim=1)
        k = g4.apply_rotary_pos_emb(k, cos, sin, unsqueeze_dim=1)
        k, v = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, scale=1.0).transpose(1, 2).reshape(1, n_blk, -1)
        x = x + norm(p + "post_attention_layernorm.weight", H)(F.linear(attn, w[p + "self_attn.o_proj.weight"]))
        mlp = g4.Gemma4TextMLP(text, i)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(mlp, name).weight.copy_(w[p + f"mlp.{name}.weight"])
        x = x + norm(p + "post_feedforward_layernorm.weight", H)(mlp(norm(p + "pre_feedforward_layernorm.weight", H)(x)))
        x = x * w[p + "layer_scalar"]
    logits = F.linear(norm("norm.weight", H)(x), w["lm_head.weight"])
    return torch.tanh(logits / 30.0) * 30.0


def test_gemma_block_drafter_matches_transformers_modules(hybrid_root, tmp_path):
    target = load_target(hm.checkpoint(str(hybrid_root), True, arch="gemma4"), dtype="float32")
    path = deepspec_drafter(tmp_path)
    drafter = load_drafter(path, target)
    c = drafter.config
    assert (c.kind, c.gemma_blocks, c.attention_k_eq_v, c.head_dim, c.num_kv_heads) == ("dspark", True, True, 32, 1)
    assert c.rope.rope_type == "proportional" and c.own_embed_tokens and c.own_lm_head
    taps = torch.randn(1, 9, len(TAPS) * H, generator=torch.Generator().manual_seed(0))
    block = torch.tensor([[17] + [hm.VOCAB - 1] * (BLOCK - 1)])
    cache = drafter.new_cache(1, 32)
    with torch.no_grad():
        drafter.extend_context(taps, cache)
        ours = drafter.logits(drafter.block_hidden(block[:, 0], BLOCK, cache))
    assert (ours - reference_block_logits(path, taps, block)).abs().max().item() <= 1e-4


def test_gemma_block_drafter_drafts_in_the_engine_and_is_not_saved_as_qwen(hybrid_root, tmp_path):
    from blockdraft.engine.engine import EngineConfig, LLMEngine
    from blockdraft.sampling.params import SamplingParams
    target = load_target(hm.checkpoint(str(hybrid_root), True, arch="gemma4"), dtype="bfloat16")
    drafter = load_drafter(deepspec_drafter(tmp_path), target)
    prompts = hm.prompts(3, seed=5, low=3, high=20)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    config = EngineConfig(max_batch=3, cache_budget_bytes=4 << 20, max_model_len=64, adaptive_speculation=False)
    spec = LLMEngine(target, drafter, config).generate(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in LLMEngine(target, None, config).generate(prompts, params)]
    with pytest.raises(ConfigError, match="Gemma blocks"):
        save_drafter(drafter, target, tmp_path / "out")


def test_gemma_block_drafter_layouts_are_checked(hybrid_root, tmp_path):
    target = load_target(hm.checkpoint(str(hybrid_root), True, arch="gemma4"), dtype="float32")
    path = deepspec_drafter(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "layer_types": ["sliding_attention", "full_attention"]}))
    with pytest.raises(ConfigError, match="layer_types must all be full_attention"):
        load_drafter(path, target)
    (path / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["embed_tokens.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ConfigError, match="ships no embed_tokens.weight"):
        load_drafter(path, target)
