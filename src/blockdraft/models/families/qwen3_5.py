"""Qwen3.5 (transformers `qwen3_5`, `qwen3_5_moe`, text-only or multimodal): hybrid Gated DeltaNet and
gated-attention layers (`models/qwen3_5.py`), dense or with a softmax-routed MoE and a shared expert.

Its checkpoints name modules as the model does (the vision tower and MTP head are set aside at load);
per-expert tensors are stacked.
"""

from __future__ import annotations

from torch import nn

from ...checkpoints.hf_config import check_silu, decoder_dims, eos_ids, require, text_decoder
from ...config import DeltaNetConfig, MoeConfig, TargetConfig
from ...errors import ConfigError
from ...layers.rope import Rotary
from ..family import DecoderParts, Family
from ..qwen3_5 import HybridDecoderLayer, OffsetRMSNorm

ARCHITECTURES = {"Qwen3_5ForCausalLM": "qwen3_5", "Qwen3_5ForConditionalGeneration": "qwen3_5",
                 "Qwen3_5MoeForCausalLM": "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe"}
MODEL_TYPES = {"qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5", "qwen3_5_moe": "qwen3_5_moe",
               "qwen3_5_moe_text": "qwen3_5_moe"}

LEGACY_LAYER_TYPES = {"attention": "full_attention", "mamba": "linear_attention"}


def resolve(outer: dict, arch: str) -> TargetConfig:
    """transformers' `qwen3_5` / `qwen3_5_moe`: a text-only config, or the multimodal one whose text
    decoder sits under `text_config` (the vision tower is not run)."""
    cfg = text_decoder(outer, tie_default=False)
    check_silu(cfg)
    layers = int(require(cfg, "num_hidden_layers", "target"))
    types = cfg.get("layer_types")
    if types is None:
        interval = int(cfg.get("full_attention_interval", 4))
        if interval < 1:
            raise ConfigError(f"full_attention_interval must be >= 1, got {interval}")
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    if not isinstance(types, list):
        raise ConfigError(f"layer_types must be a list, got {types!r}")
    types = tuple(LEGACY_LAYER_TYPES.get(t, t) for t in types)
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    deltanet = DeltaNetConfig(
        num_k_heads=int(cfg.get("linear_num_key_heads", 16)), num_v_heads=int(cfg.get("linear_num_value_heads", 32)),
        k_dim=int(cfg.get("linear_key_head_dim", 128)), v_dim=int(cfg.get("linear_value_head_dim", 128)),
        conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)))
    moe = None
    if arch == "qwen3_5_moe":
        moe = MoeConfig(num_experts=int(require(cfg, "num_experts", "target")),
                        top_k=int(require(cfg, "num_experts_per_tok", "target")),
                        expert_intermediate_size=int(require(cfg, "moe_intermediate_size", "target")),
                        shared_intermediate_size=int(require(cfg, "shared_expert_intermediate_size", "target")))
        cfg.setdefault("intermediate_size", moe.expert_intermediate_size)
    return TargetConfig(
        architecture=arch, **decoder_dims(cfg, "target"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=True,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids(cfg),
        layer_types=types, deltanet=deltanet, moe=moe, partial_rotary_factor=float(partial),
        attn_output_gate=True, norm_offset=True,
    )


def decoder(cfg: TargetConfig) -> DecoderParts:
    return DecoderParts(nn.ModuleList(HybridDecoderLayer(cfg, i) for i in range(cfg.num_layers)),
                        OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps), Rotary(cfg.rope, cfg.rotary_dim))


FAMILY = Family(name="qwen3_5", architectures=ARCHITECTURES, model_types=MODEL_TYPES, resolve=resolve,
                decoder=decoder)
