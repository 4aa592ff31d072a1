"""gpt-oss (transformers `gpt_oss`): attention with sinks and q/k/v/o biases, sliding-window layers
alternating with full ones, yarn RoPE, and a top-k-then-softmax MoE with the clamped SwiGLU in every
layer. Its layers are `models/decoder.py`'s.

Its checkpoints publish the experts in MXFP4 (`quantization_config.quant_method: mxfp4`, dequantized
at load) or, from transformers, in bf16 as [E, in, out]; both become `layers/moe.py`'s layout here.
"""

from __future__ import annotations

import re

import torch

from ...checkpoints import mxfp4
from ...checkpoints.hf_config import decoder_dims, eos_ids, require
from ...config import MoeConfig, TargetConfig
from ...errors import CheckpointError, ConfigError
from ..decoder import DecoderLayer
from ..family import Family, plain_decoder

ARCHITECTURES = {"GptOssForCausalLM": "gpt_oss"}
MODEL_TYPES = {"gpt_oss": "gpt_oss"}

# transformers' GptOssConfig default (the published config spells the same values under `rope_scaling`)
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def resolve(cfg: dict, arch: str) -> TargetConfig:
    """transformers' `gpt_oss`: attention with sinks and q/k/v/o biases, sliding-window layers alternating
    with full ones (`layer_types`; the first sliding), yarn RoPE, and a top-k-then-softmax MoE with biases
    and the clamped SwiGLU in every layer."""
    cfg = dict(cfg)
    layers = int(require(cfg, "num_hidden_layers", "target"))
    types = cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if not isinstance(types, list):
        raise ConfigError(f"layer_types must be a list, got {types!r}")
    if not (cfg.get("rope_parameters") or cfg.get("rope_scaling")):
        cfg["rope_parameters"] = {**GPT_OSS_ROPE, "rope_theta": cfg.get("rope_theta", 150000.0)}
    elif "rope_theta" not in (cfg.get("rope_parameters") or cfg.get("rope_scaling")):
        cfg.setdefault("rope_theta", 150000.0)
    for key, value in (("attention_bias", True), ("rms_norm_eps", 1e-5), ("head_dim", 64), ("num_key_value_heads", 8)):
        cfg.setdefault(key, value)                    # transformers' GptOssConfig defaults
    experts = cfg.get("num_local_experts", cfg.get("num_experts"))
    if experts is None:
        raise ConfigError("target config.json has no 'num_local_experts'")
    moe = MoeConfig(num_experts=int(experts),
                    top_k=int(cfg.get("num_experts_per_tok", cfg.get("experts_per_token", 4))),
                    expert_intermediate_size=int(require(cfg, "intermediate_size", "target")),
                    router="topk_softmax", biases=True, activation="clamped_swiglu",
                    swiglu_limit=float(cfg.get("swiglu_limit", 7.0)))
    return TargetConfig(
        architecture=arch, **decoder_dims(cfg, "target"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 131072)),
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos_ids(cfg), layer_types=tuple(types), moe=moe,
        sliding_window=cfg.get("sliding_window", 128), attention_sinks=True,
    )


_GPT_OSS_EXPERTS = re.compile(r"^(layers\.\d+\.mlp)\.experts\.(gate_up_proj|down_proj)(_blocks|_scales|_bias|)$")


def tensor_names(tensors: dict[str, torch.Tensor], cfg: TargetConfig,
                 skipped: dict[str, int]) -> dict[str, torch.Tensor]:
    """gpt-oss's experts -> `layers/moe.py`'s layout. Published: MXFP4 `*_blocks` / `*_scales` [E, out,
    in / 32, ...] (dequantized, `checkpoints/mxfp4.py`); transformers' bf16 save: `gate_up_proj` [E, H, 2I]
    and `down_proj` [E, I, H] (x @ W, transposed here). The gate and up columns interleave (gate even, up
    odd): split into gate rows then up rows, biases alike. The router is `mlp.router` (here `mlp.gate`)."""
    out, parts = {}, {}
    for name, t in tensors.items():
        m = _GPT_OSS_EXPERTS.match(name)
        if m is None:
            out[name.replace(".mlp.router.", ".mlp.gate.")] = t
        else:
            parts.setdefault((m.group(1), m.group(2)), {})[m.group(3)] = t
    for (base, proj), have in parts.items():
        name = f"{base}.experts.{proj}"
        if ("_blocks" in have or "_scales" in have) and "" in have:
            raise CheckpointError(f"target: {name} is in the checkpoint both as bf16 and as MXFP4 blocks/scales; "
                                  "keep one form")
        if "_blocks" in have or "_scales" in have:
            if not {"_blocks", "_scales"} <= set(have):
                missing = "_scales" if "_blocks" in have else "_blocks"
                raise CheckpointError(f"target: missing tensors {name}{missing} (MXFP4 needs blocks and scales)")
            w = mxfp4.dequantize(have["_blocks"], have["_scales"], name)               # [E, out, in]
        elif "" in have:
            w = have[""].transpose(1, 2)                                              # [E, in, out] -> [E, out, in]
        else:
            raise CheckpointError(f"target: missing tensors {name} (or {name}_blocks / _scales)")
        bias = have.get("_bias")
        if proj == "gate_up_proj":
            w = torch.cat([w[:, 0::2], w[:, 1::2]], dim=1)                             # [E, gate rows ‖ up rows, H]
            bias = None if bias is None else torch.cat([bias[:, 0::2], bias[:, 1::2]], dim=1)
        out[name] = w.contiguous()
        if bias is not None:
            out[f"{name}_bias"] = bias.contiguous()
    return out


FAMILY = Family(name="gpt_oss", architectures=ARCHITECTURES, model_types=MODEL_TYPES, resolve=resolve,
                decoder=plain_decoder(DecoderLayer), tensor_names=tensor_names, checkpoint_quantizations=("mxfp4",))
