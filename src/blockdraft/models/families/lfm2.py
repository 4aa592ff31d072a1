"""LFM2 (transformers `lfm2`, `lfm2_moe`): short-convolution layers (`models/lfm2.py`) beside Qwen3-style
attention layers (`models/decoder.py`), a SwiGLU feed-forward or, past the first dense layers,
sigmoid-routed experts.

Its checkpoint spells the attention and feed-forward modules its own way (`LFM2_NAMES`); they are
renamed at load to the Llama-style modules they run on.
"""

from __future__ import annotations

import torch

from ...checkpoints.experts import stacked_experts
from ...checkpoints.hf_config import decoder_dims, eos_ids, require
from ...config import MoeConfig, ShortConvConfig, TargetConfig
from ...errors import ConfigError
from ...layers.moe import feed_forward
from ..decoder import DecoderLayer
from ..family import Family, plain_decoder
from ..lfm2 import ShortConvLayer

ARCHITECTURES = {"Lfm2ForCausalLM": "lfm2", "Lfm2MoeForCausalLM": "lfm2_moe"}
MODEL_TYPES = {"lfm2": "lfm2", "lfm2_moe": "lfm2_moe"}

LFM2_LAYER_TYPES = {"conv": "short_conv", "full_attention": "full_attention", "attention": "full_attention"}


def resolve(cfg: dict, arch: str) -> TargetConfig:
    """transformers' `lfm2` / `lfm2_moe`: short-conv layers beside Qwen3-style attention layers
    (`layer_types`, or `full_attn_idxs`); a SwiGLU feed-forward whose width LFM2 derives from
    `intermediate_size` (LFM2-MoE takes it as written, in its first `num_dense_layers` layers, and runs
    the sigmoid-routed experts in the rest)."""
    layers = int(require(cfg, "num_hidden_layers", "target"))
    types = cfg.get("layer_types")
    if types is None:
        full = cfg.get("full_attn_idxs")
        full = set(range(layers) if full is None else full)
        types = ["full_attention" if i in full else "conv" for i in range(layers)]
    if not isinstance(types, list):
        raise ConfigError(f"layer_types must be a list, got {types!r}")
    types = tuple(LFM2_LAYER_TYPES.get(t, t) for t in types)
    # transformers' Lfm2Config: `block_ff_dim` (LFM2-1.2B's spelling) wins over `intermediate_size`;
    # Lfm2MoeConfig reads `intermediate_size` only. Absent: their defaults.
    inter = cfg.get("block_ff_dim") if arch == "lfm2" else None
    inter = int(inter or cfg.get("intermediate_size") or (12288 if arch == "lfm2" else 7168))
    moe = None
    if arch == "lfm2_moe":
        moe = MoeConfig(num_experts=int(require(cfg, "num_experts", "target")),
                        top_k=int(require(cfg, "num_experts_per_tok", "target")),
                        expert_intermediate_size=int(require(cfg, "moe_intermediate_size", "target")),
                        router="sigmoid", norm_topk=bool(cfg.get("norm_topk_prob", True)),
                        routed_scaling=float(cfg.get("routed_scaling_factor", 1.0)),
                        expert_bias=bool(cfg.get("use_expert_bias", True)),
                        dense_layers=int(cfg.get("num_dense_layers", 2)))
    elif cfg.get("block_auto_adjust_ff_dim", True):          # LFM2's own rule (transformers' Lfm2MLP)
        inter = int(2 * inter / 3)
        multiplier, multiple = cfg.get("block_ffn_dim_multiplier", 1.0), int(cfg.get("block_multiple_of", 256))
        if multiplier is not None:
            inter = int(multiplier * inter)
            inter = multiple * ((inter + multiple - 1) // multiple)
    dims = dict(cfg, intermediate_size=inter, rms_norm_eps=cfg.get("norm_eps", cfg.get("rms_norm_eps", 1e-5)))
    rope = dims.get("rope_parameters") or dims.get("rope_scaling") or {}
    if "rope_theta" not in rope:
        dims.setdefault("rope_theta", 1_000_000.0)              # LFM2's default_theta
    return TargetConfig(
        architecture=arch, **decoder_dims(dims, "target"),
        # LFM2's own spelling `tie_embedding` wins where both are given, as in transformers
        tie_word_embeddings=bool(cfg.get("tie_embedding", cfg.get("tie_word_embeddings", True))),
        qk_norm=True, max_position_embeddings=int(cfg.get("max_position_embeddings", 128_000)),
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos_ids(cfg), layer_types=types, moe=moe,
        short_conv=ShortConvConfig(conv_dim=int(cfg["hidden_size"]), conv_kernel=int(cfg.get("conv_L_cache", 3)),
                                   bias=bool(cfg.get("conv_bias", False))),
    )


LFM2_NAMES = ((".operator_norm.", ".input_layernorm."), (".ffn_norm.", ".post_attention_layernorm."),
              (".feed_forward.", ".mlp."), (".w1.", ".gate_proj."), (".w3.", ".up_proj."), (".w2.", ".down_proj."),
              (".self_attn.out_proj.", ".self_attn.o_proj."),
              (".self_attn.q_layernorm.", ".self_attn.q_norm."), (".self_attn.k_layernorm.", ".self_attn.k_norm."))


def module_name(name: str) -> str:
    """LFM2's names -> the Llama-style modules its attention and feed-forward run on."""
    if name.startswith("embedding_norm."):
        return "norm." + name[len("embedding_norm."):]
    for old, new in LFM2_NAMES:
        name = name.replace(old, new)
    return name


def tensor_names(tensors: dict[str, torch.Tensor], cfg: TargetConfig,
                 skipped: dict[str, int]) -> dict[str, torch.Tensor]:
    """Experts stacked (LFM2-MoE spells them `feed_forward.experts.E.{w1,w3,w2}`), then every name mapped."""
    return {module_name(n): t for n, t in stacked_experts(tensors, cfg, skipped).items()}


def layer(cfg: TargetConfig, i: int):
    if cfg.layer_type(i) == "short_conv":
        return ShortConvLayer(cfg, feed_forward(cfg, i))
    return DecoderLayer(cfg, i)


FAMILY = Family(name="lfm2", architectures=ARCHITECTURES, model_types=MODEL_TYPES, resolve=resolve,
                decoder=plain_decoder(layer), tensor_names=tensor_names)
