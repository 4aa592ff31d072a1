"""Gemma 4 (transformers `gemma4` with its text decoder under `text_config`, or `gemma4_text`): 5:1
sliding/full attention layers with their own geometry and RoPE, shared-KV layers, per-layer embeddings,
a GeGLU MLP beside optional routed experts, final-logit softcapping. Its layers are `models/gemma4.py`'s.

Also here: the checkpoint's per-layer-embedding names and the K/V tensors of shared layers it carries
but never runs, the √H embedding scale, and DeepSpec's Gemma 4 DSpark drafter, whose config copies the
target's (`drafter_dims`).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from ...checkpoints.experts import stacked_experts
from ...checkpoints.hf_config import decoder_dims, eos_ids, require, resolve_rope, text_decoder
from ...config import MoeConfig, RopeConfig, TargetConfig
from ...errors import ConfigError
from ...layers.norm import RMSNorm
from ..family import DecoderParts, Family
from ..gemma4 import Gemma4Layer, PerLayerEmbeddings, TypedRotary

ARCHITECTURES = {"Gemma4ForCausalLM": "gemma4", "Gemma4ForConditionalGeneration": "gemma4"}
MODEL_TYPES = {"gemma4": "gemma4", "gemma4_text": "gemma4"}

GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
GEMMA4_ACTS = ("gelu_pytorch_tanh", "gelu_tanh")      # the tanh-approximated GELU, as transformers spells it


def full_layer_geometry(cfg: dict, full: list[int]) -> tuple[int, int | None, RopeConfig]:
    """Gemma 4's full-attention layers' (head dim, KV heads or None = the model's, RoPE): 5.15's
    `per_layer_config` (one override for every full layer), else `global_head_dim` and — where
    `attention_k_eq_v` — `num_global_key_value_heads`; RoPE from `rope_parameters["full_attention"]`.
    Also checks the activation (GeGLU only)."""
    act = cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))
    if act not in GEMMA4_ACTS:
        raise ConfigError(f"hidden_activation={act!r} is not supported (supported: {sorted(GEMMA4_ACTS)})")
    geometry = {}
    for key, value in (cfg.get("per_layer_config") or {}).items():
        if int(key) not in full:
            raise ConfigError(f"per_layer_config overrides layer {key}, which is not a full-attention layer")
        if geometry and value != geometry:
            raise ConfigError(f"per_layer_config gives full-attention layers different geometry: {geometry} and {value}")
        geometry = dict(value)
    k_eq_v = bool(cfg.get("attention_k_eq_v", False))
    head_dim = int(geometry.get("head_dim", cfg.get("global_head_dim", 512)))
    field = "per_layer_config num_key_value_heads" if "num_key_value_heads" in geometry else "num_global_key_value_heads"
    kv = geometry.get("num_key_value_heads", cfg.get("num_global_key_value_heads") if k_eq_v else None)
    heads = int(cfg.get("num_attention_heads", 8))
    if kv is not None and (int(kv) < 1 or heads % int(kv)):
        raise ConfigError(f"{field}={kv} does not divide num_attention_heads={heads}")
    rope = cfg.get("rope_parameters") or {}
    rope = rope if "rope_type" in rope else rope.get("full_attention", GEMMA4_ROPE["full_attention"])
    return head_dim, None if kv is None else int(kv), resolve_rope({"rope_parameters": rope})


def resolve(outer: dict, arch: str) -> TargetConfig:
    """transformers' `gemma4` (the text decoder under `text_config`; the vision and audio towers are not
    run) or `gemma4_text`: 5:1 sliding/full layers (the last full), full layers' own head geometry,
    q/k/v norms, k = v on full layers, shared-KV layers, per-layer embeddings, a GeGLU MLP beside optional
    routed experts, final-logit softcapping. Defaults are transformers' `Gemma4TextConfig`'s."""
    cfg = text_decoder(outer, tie_default=True)
    layers = int(require(cfg, "num_hidden_layers", "target"))
    if cfg.get("use_bidirectional_attention") == "all":
        raise ConfigError("use_bidirectional_attention='all' makes every layer bidirectional: not a causal "
                          "decoder, so it cannot be decoded token by token")
    types = cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or not types:
        raise ConfigError(f"layer_types must be a non-empty list, got {types!r}")
    types = [*types[:-1], "full_attention"]          # transformers forces the last layer to full attention
    head_dim, global_kv, global_rope = full_layer_geometry(cfg, [i for i, t in enumerate(types) if t == "full_attention"])
    sliding_rope = (cfg.get("rope_parameters") or {}).get("sliding_attention", GEMMA4_ROPE["sliding_attention"])
    ple = int(cfg.get("hidden_size_per_layer_input", 256) or 0)
    moe = None
    if cfg.get("enable_moe_block"):
        moe = MoeConfig(num_experts=int(require(cfg, "num_experts", "target")),
                        top_k=int(require(cfg, "top_k_experts", "target")),
                        expert_intermediate_size=int(require(cfg, "moe_intermediate_size", "target")),
                        router="normed_softmax", activation="gelu_tanh")
    cfg.setdefault("head_dim", 256)
    cfg.setdefault("num_key_value_heads", 4)
    cfg.setdefault("eos_token_id", 1)
    cfg.setdefault("bos_token_id", 2)
    dims = {**decoder_dims(cfg, "target"), "rope": resolve_rope({"rope_parameters": sliding_rope})}
    return TargetConfig(
        architecture=arch, **dims, global_rope=global_rope,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)), qk_norm=True,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 131072)),
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=eos_ids(cfg), layer_types=tuple(types), moe=moe,
        sliding_window=cfg.get("sliding_window", 512), global_head_dim=head_dim, global_kv_heads=global_kv,
        attention_k_eq_v=bool(cfg.get("attention_k_eq_v", False)),
        kv_shared_layers=int(cfg.get("num_kv_shared_layers") or 0), per_layer_input_size=ple,
        per_layer_vocab_size=int(cfg.get("vocab_size_per_layer_input", 262144) or 0) if ple else 0,
        double_wide_mlp=bool(cfg.get("use_double_wide_mlp", False)), hidden_act="gelu_tanh",
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
    )


GEMMA4_PER_LAYER = ("embed_tokens_per_layer.", "per_layer_model_projection.", "per_layer_projection_norm.")
_SHARED_KV = re.compile(r"^layers\.(\d+)\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\.")


def tensor_names(tensors: dict[str, torch.Tensor], cfg: TargetConfig,
                 skipped: dict[str, int]) -> dict[str, torch.Tensor]:
    """The per-layer-embedding tensors under `per_layer.`; the K/V projections that published checkpoints
    carry for shared-KV layers, which those layers never run, set aside (and counted)."""
    out = {}
    for name, t in stacked_experts(tensors, cfg, skipped).items():
        m = _SHARED_KV.match(name)
        if m is not None and cfg.kv_shared(int(m.group(1))):
            skipped["shared-KV layers' k/v *"] = skipped.get("shared-KV layers' k/v *", 0) + 1
            continue
        out["per_layer." + name if name.startswith(GEMMA4_PER_LAYER) else name] = t
    return out


def drafter_dims(cfg: dict, shapes: dict[str, tuple[int, ...]]) -> dict:
    """DeepSpec's Gemma 4 DSpark (`Gemma4DSparkModel`, a copy of the target's Gemma 4 text config): every
    drafter layer is a non-causal full-attention layer with the target's full-attention geometry and RoPE
    (`full_layer_geometry`) and its own √H-scaled embedding. {} for any other drafter."""
    archs = cfg.get("architectures") or []
    if not (any(a.startswith("Gemma4") for a in archs) or str(cfg.get("model_type", "")).startswith("gemma4")):
        return {}
    layers = int(require(cfg, "num_hidden_layers", "drafter"))
    types = cfg.get("layer_types") or ["full_attention"] * layers
    if any(t != "full_attention" for t in types):
        raise ConfigError(f"drafter Gemma4DSparkModel layer_types must all be full_attention (its layers attend over "
                          f"the whole context), got {types}")
    if "embed_tokens.weight" not in shapes:
        raise ConfigError("drafter Gemma4DSparkModel ships no embed_tokens.weight: its block embedding is its own, "
                          "scaled by √hidden_size (the target's unscaled one would silently change its drafts)")
    head_dim, kv, rope = full_layer_geometry(cfg, list(range(layers)))
    return {"head_dim": head_dim, "rope": rope, **({} if kv is None else {"num_kv_heads": kv})}


def decoder(cfg: TargetConfig) -> DecoderParts:
    layers = nn.ModuleList(Gemma4Layer(cfg, i) for i in range(cfg.num_layers))
    norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    extras = {"per_layer": PerLayerEmbeddings(cfg)} if cfg.per_layer_input_size else {}
    return DecoderParts(layers, norm, TypedRotary(cfg), extras)


def embed(model: nn.Module, input_ids: torch.Tensor, x: torch.Tensor, step) -> torch.Tensor:
    """The embeddings scaled by √H (rounded to the weights' dtype, as transformers does); the step gets
    its per-layer inputs and a place for the K/V its shared layers reuse."""
    x = x * torch.tensor(model.config.hidden_size ** 0.5, dtype=x.dtype)
    step.shared_kv = {}
    if model.config.per_layer_input_size:
        step.per_layer_inputs = model.per_layer(input_ids, x)
    return x


FAMILY = Family(name="gemma4", architectures=ARCHITECTURES, model_types=MODEL_TYPES, resolve=resolve,
                decoder=decoder, tensor_names=tensor_names, embed=embed, drafter_dims=drafter_dims)
