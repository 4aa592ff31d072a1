"""Config spellings → one frozen `TargetConfig` / `DrafterConfig` (docs/design.md §3).

Each drafter field has a table of places it may be spelled; every place that is
present is read, and they must agree (first found wins only when they do).
Keys that matter only for training are ignored; keys that would change drafting
and are not implemented are refused by name.
"""

from __future__ import annotations

import logging
from typing import Any

from ..config import (DRAFTER_KINDS, DeltaNetConfig, DrafterConfig, MoeConfig, RopeConfig, ShortConvConfig,
                      TargetConfig, default_tap_point)
from ..errors import ConfigError

log = logging.getLogger(__name__)

_MISSING = object()

# field -> where it may be spelled: ("nested", key) looks in dflash_config then dspark_config.
DRAFTER_SPELLINGS: dict[str, list[str]] = {
    "tap_point": ["dflash_config.tap_point", "dspark_config.tap_point", "tap_point", "dspark_tap_point"],
    "target_layer_ids": ["dflash_config.target_layer_ids", "dspark_config.target_layer_ids",
                         "target_layer_ids", "dspark_target_layer_ids", "aux_hidden_state_layer_ids"],
    "draft_vocab_size": ["draft_vocab_size", "dflash_config.draft_vocab_size", "dspark_config.draft_vocab_size"],
    "mask_token_id": ["dflash_config.mask_token_id", "dspark_config.mask_token_id", "mask_token_id",
                      "dspark_mask_token_id", "dspark_noise_token_id"],
    "block_size": ["dflash_config.block_size", "dspark_config.block_size", "block_size", "dspark_block_size"],
    "markov_rank": ["markov_rank", "dflash_config.markov_rank", "dspark_config.markov_rank", "dspark_markov_rank"],
    "markov_head_type": ["markov_head_type", "dflash_config.markov_head_type",
                         "dspark_config.markov_head_type", "dspark_markov_head_type"],
    "enable_confidence_head": ["enable_confidence_head", "dflash_config.enable_confidence_head",
                               "dspark_config.enable_confidence_head", "dspark_enable_confidence_head"],
    "confidence_head_with_markov": ["confidence_head_with_markov", "dflash_config.confidence_head_with_markov",
                                    "dspark_config.confidence_head_with_markov",
                                    "dspark_confidence_head_with_markov"],
    "shift_label": ["shift_label", "dflash_config.shift_label", "dspark_config.shift_label", "dspark_shift_label"],
    "num_draft_tokens": ["num_draft_tokens", "dflash_config.num_draft_tokens", "dspark_config.num_draft_tokens"],
    "input_embedding_scale": ["dflash_config.input_embedding_scale", "input_embedding_scale"],
    "output_multiplier": ["dflash_config.output_multiplier", "output_multiplier"],
    "final_logit_softcapping": ["dflash_config.final_logit_softcapping", "final_logit_softcapping"],
    "conv_kernel_size": ["dflash_config.conv_kernel_size", "conv_kernel_size"],
    "conv_group_size": ["dflash_config.conv_group_size", "conv_group_size"],
    "selector_top_k": ["dflash_config.selector_top_k", "selector_top_k"],
    "selector_rank": ["dflash_config.selector_rank", "selector_rank"],
}

# An ORT-GenAI runtime JSON section (`model.dspark` / `model.dflash2`) is one more spelling of each field.
for _name, _places in DRAFTER_SPELLINGS.items():
    _places.append(f"runtime.{_name}")

ARCHITECTURE_KINDS = {
    "DFlashDraftModel": "dflash",
    "DFlash2DraftModel": "dflash2",
    "Qwen3DSparkModel": "dspark",
    "DSparkDraftModel": "dspark",
    "Lfm2DSparkDraftModel": "dspark",  # LiquidAI
    "DFlashSpeculator": "dflash",     # vLLM speculators
    "DSparkSpeculator": "dspark",
}

# speculators keeps the decoder shape under `transformer_layer_config` and names the algorithm here
SPECULATORS_KINDS = {"dflash": "dflash", "dflash2": "dflash2", "dspark": "dspark"}
TRAINING_ONLY_TENSORS = ("verifier_lm_head.weight", "verifier_norm.weight")

# Keys that change what a drafter proposes and that blockdraft does not implement.
REFUSED_KEYS = {
    "hc_mult": "hyper-connection (DeepSeek-V4 MTP) drafters",
    "n_mtp_layers": "DeepSeek-V4 MTP stacks",
    "attn_logit_softcapping": "attention logit soft-capping",
}

MARKOV_TENSORS = {  # canonical name -> accepted spellings
    "markov_head.markov_w1.weight": ("markov_head.markov_w1.weight", "markov_w1.weight"),
    "markov_head.markov_w2.weight": ("markov_head.markov_w2.weight", "markov_w2.weight"),
    "confidence_head.proj.weight": ("confidence_head.proj.weight", "confidence_proj.weight"),
    "confidence_head.proj.bias": ("confidence_head.proj.bias", "confidence_proj.bias"),
    "candidate_selector.predecessor_codebook.weight": ("candidate_selector.predecessor_codebook",
                                                       "candidate_selector.predecessor_codebook.weight"),
    "candidate_selector.successor_codebook.weight": ("candidate_selector.successor_codebook",
                                                     "candidate_selector.successor_codebook.weight"),
}


def _lookup(cfg: dict, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def read_field(cfg: dict, name: str, spellings: list[str] | None = None) -> Any:
    """Value of `name` over all its spellings; conflicting values are an error."""
    found = [(s, v) for s in (spellings or DRAFTER_SPELLINGS[name])
             if (v := _lookup(cfg, s)) is not _MISSING and v is not None]
    if not found:
        return _MISSING
    first_key, first = found[0]
    for key, value in found[1:]:
        if _normalise(value) != _normalise(first):
            raise ConfigError(f"conflicting values for {name}: {first_key}={first!r} but {key}={value!r}")
    return first


def _normalise(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def resolve_rope(cfg: dict) -> RopeConfig:
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    orig = params.get("original_max_position_embeddings",
                      cfg.get("original_max_position_embeddings", cfg.get("max_position_embeddings", 2048)))
    factor = params.get("factor")
    if factor is None:
        factor = cfg.get("max_position_embeddings", orig) / orig if rope_type == "yarn" else 1.0
    return RopeConfig(
        theta=float(theta), rope_type=rope_type, factor=float(factor),
        original_max_position_embeddings=int(orig),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        beta_fast=float(params.get("beta_fast") or 32.0), beta_slow=float(params.get("beta_slow") or 1.0),
        attention_factor=params.get("attention_factor"), mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"), truncate=bool(params.get("truncate", True)),
        partial_rotary_factor=float(params.get("partial_rotary_factor", 1.0)),
    )


def _require(cfg: dict, key: str, what: str) -> Any:
    if cfg.get(key) is None:
        raise ConfigError(f"{what} config.json has no {key!r}" + (" (it is null)" if key in cfg else ""))
    return cfg[key]


def _dims(cfg: dict, what: str) -> dict:
    heads = int(_require(cfg, "num_attention_heads", what))
    hidden = int(_require(cfg, "hidden_size", what))
    return dict(
        vocab_size=int(_require(cfg, "vocab_size", what)),
        hidden_size=hidden,
        intermediate_size=int(_require(cfg, "intermediate_size", what)),
        num_layers=int(_require(cfg, "num_hidden_layers", what)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=resolve_rope(cfg),
        attention_bias=bool(cfg.get("attention_bias", False)),
    )


QWEN3_5_ARCHITECTURES = {
    "Qwen3_5ForCausalLM": "qwen3_5", "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
}
QWEN3_5_MODEL_TYPES = {"qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5",
                       "qwen3_5_moe": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe"}
SUPPORTED_TARGETS = ("LlamaForCausalLM", "Qwen3ForCausalLM", *QWEN3_5_ARCHITECTURES, "Lfm2ForCausalLM",
                     "Lfm2MoeForCausalLM", "GptOssForCausalLM", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")


def _target_architecture(cfg: dict) -> str:
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type", "")
    for a in archs:
        if a in QWEN3_5_ARCHITECTURES:
            return QWEN3_5_ARCHITECTURES[a]
    if "Qwen3ForCausalLM" in archs or model_type == "qwen3":
        return "qwen3"
    if "LlamaForCausalLM" in archs or model_type == "llama":
        return "llama"
    if "Lfm2ForCausalLM" in archs or model_type == "lfm2":
        return "lfm2"
    if "Lfm2MoeForCausalLM" in archs or model_type == "lfm2_moe":
        return "lfm2_moe"
    if "GptOssForCausalLM" in archs or model_type == "gpt_oss":
        return "gpt_oss"
    if {"Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"} & set(archs) or model_type in ("gemma4", "gemma4_text"):
        return "gemma4"
    if model_type in QWEN3_5_MODEL_TYPES:
        return QWEN3_5_MODEL_TYPES[model_type]
    raise ConfigError(f"target architecture {archs or model_type!r} is not supported "
                      f"(supported: {', '.join(SUPPORTED_TARGETS)})")


def resolve_target(cfg: dict) -> TargetConfig:
    arch = _target_architecture(cfg)
    quant = (cfg.get("quantization_config") or {}).get("quant_method")
    if quant is not None and (quant, arch) != ("mxfp4", "gpt_oss"):
        raise ConfigError(f"target quantization_config.quant_method={quant!r} is not supported for {arch} "
                          "(blockdraft reads bf16/fp32 checkpoints, and gpt-oss's MXFP4 experts; quantize at load "
                          "with --quantization int4|int8)")
    if arch == "gpt_oss":
        return _resolve_gpt_oss(cfg)
    if arch == "gemma4":
        return _resolve_gemma4(cfg)
    if arch.startswith("qwen3_5"):
        return _resolve_qwen3_5(cfg, arch)
    if arch.startswith("lfm2"):
        return _resolve_lfm2(cfg, arch)
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act={cfg['hidden_act']!r} is not supported (only 'silu')")
    return TargetConfig(
        architecture=arch, **_dims(cfg, "target"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=arch == "qwen3",
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg),
    )


def _eos_ids(cfg: dict) -> tuple[int, ...]:
    eos = cfg.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))


def _text_decoder(outer: dict, tie_default: bool) -> dict:
    """The text decoder's config: a multimodal layout's `text_config`, with the outer config's
    `eos_token_id` / `bos_token_id` where it lacks them and the outer `tie_word_embeddings` (absent:
    `tie_default`, the multimodal class's default), which is what transformers ties that model's head by;
    else the config itself."""
    text = outer.get("text_config")
    if not text:
        return dict(outer)
    cfg = dict(text)
    for key in ("eos_token_id", "bos_token_id"):
        if key not in cfg and key in outer:
            cfg[key] = outer[key]
    cfg["tie_word_embeddings"] = outer.get("tie_word_embeddings", tie_default)
    return cfg


LEGACY_LAYER_TYPES = {"attention": "full_attention", "mamba": "linear_attention"}


def _resolve_qwen3_5(outer: dict, arch: str) -> TargetConfig:
    """transformers' `qwen3_5` / `qwen3_5_moe`: a text-only config, or the multimodal one whose text
    decoder sits under `text_config` (the vision tower is not run)."""
    cfg = _text_decoder(outer, tie_default=False)
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act={cfg['hidden_act']!r} is not supported (only 'silu')")
    layers = int(_require(cfg, "num_hidden_layers", "target"))
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
        moe = MoeConfig(num_experts=int(_require(cfg, "num_experts", "target")),
                        top_k=int(_require(cfg, "num_experts_per_tok", "target")),
                        expert_intermediate_size=int(_require(cfg, "moe_intermediate_size", "target")),
                        shared_intermediate_size=int(_require(cfg, "shared_expert_intermediate_size", "target")))
        cfg.setdefault("intermediate_size", moe.expert_intermediate_size)
    return TargetConfig(
        architecture=arch, **_dims(cfg, "target"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=True,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg),
        layer_types=types, deltanet=deltanet, moe=moe, partial_rotary_factor=float(partial),
        attn_output_gate=True, norm_offset=True,
    )


LFM2_LAYER_TYPES = {"conv": "short_conv", "full_attention": "full_attention", "attention": "full_attention"}


def _resolve_lfm2(cfg: dict, arch: str) -> TargetConfig:
    """transformers' `lfm2` / `lfm2_moe`: short-conv layers beside Qwen3-style attention layers
    (`layer_types`, or `full_attn_idxs`); a SwiGLU feed-forward whose width LFM2 derives from
    `intermediate_size` (LFM2-MoE takes it as written, in its first `num_dense_layers` layers, and runs
    the sigmoid-routed experts in the rest)."""
    layers = int(_require(cfg, "num_hidden_layers", "target"))
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
        moe = MoeConfig(num_experts=int(_require(cfg, "num_experts", "target")),
                        top_k=int(_require(cfg, "num_experts_per_tok", "target")),
                        expert_intermediate_size=int(_require(cfg, "moe_intermediate_size", "target")),
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
        architecture=arch, **_dims(dims, "target"),
        # LFM2's own spelling `tie_embedding` wins where both are given, as in transformers
        tie_word_embeddings=bool(cfg.get("tie_embedding", cfg.get("tie_word_embeddings", True))),
        qk_norm=True, max_position_embeddings=int(cfg.get("max_position_embeddings", 128_000)),
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=_eos_ids(cfg), layer_types=types, moe=moe,
        short_conv=ShortConvConfig(conv_dim=int(cfg["hidden_size"]), conv_kernel=int(cfg.get("conv_L_cache", 3)),
                                   bias=bool(cfg.get("conv_bias", False))),
    )


# transformers' GptOssConfig default (the published config spells the same values under `rope_scaling`)
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def _resolve_gpt_oss(cfg: dict) -> TargetConfig:
    """transformers' `gpt_oss`: attention with sinks and q/k/v/o biases, sliding-window layers alternating
    with full ones (`layer_types`; the first sliding), yarn RoPE, and a top-k-then-softmax MoE with biases
    and the clamped SwiGLU in every layer."""
    cfg = dict(cfg)
    layers = int(_require(cfg, "num_hidden_layers", "target"))
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
                    expert_intermediate_size=int(_require(cfg, "intermediate_size", "target")),
                    router="topk_softmax", biases=True, activation="clamped_swiglu",
                    swiglu_limit=float(cfg.get("swiglu_limit", 7.0)))
    return TargetConfig(
        architecture="gpt_oss", **_dims(cfg, "target"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 131072)),
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=_eos_ids(cfg), layer_types=tuple(types), moe=moe,
        sliding_window=cfg.get("sliding_window", 128), attention_sinks=True,
    )


GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
GEMMA4_ACTS = ("gelu_pytorch_tanh", "gelu_tanh")      # the tanh-approximated GELU, as transformers spells it


def _gemma4_full_layers(cfg: dict, full: list[int]) -> tuple[int, int | None, RopeConfig]:
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


def _resolve_gemma4(outer: dict) -> TargetConfig:
    """transformers' `gemma4` (the text decoder under `text_config`; the vision and audio towers are not
    run) or `gemma4_text`: 5:1 sliding/full layers (the last full), full layers' own head geometry,
    q/k/v norms, k = v on full layers, shared-KV layers, per-layer embeddings, a GeGLU MLP beside optional
    routed experts, final-logit softcapping. Defaults are transformers' `Gemma4TextConfig`'s."""
    cfg = _text_decoder(outer, tie_default=True)
    layers = int(_require(cfg, "num_hidden_layers", "target"))
    if cfg.get("use_bidirectional_attention") == "all":
        raise ConfigError("use_bidirectional_attention='all' makes every layer bidirectional: not a causal "
                          "decoder, so it cannot be decoded token by token")
    types = cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or not types:
        raise ConfigError(f"layer_types must be a non-empty list, got {types!r}")
    types = [*types[:-1], "full_attention"]          # transformers forces the last layer to full attention
    head_dim, global_kv, global_rope = _gemma4_full_layers(cfg, [i for i, t in enumerate(types) if t == "full_attention"])
    sliding_rope = (cfg.get("rope_parameters") or {}).get("sliding_attention", GEMMA4_ROPE["sliding_attention"])
    ple = int(cfg.get("hidden_size_per_layer_input", 256) or 0)
    moe = None
    if cfg.get("enable_moe_block"):
        moe = MoeConfig(num_experts=int(_require(cfg, "num_experts", "target")),
                        top_k=int(_require(cfg, "top_k_experts", "target")),
                        expert_intermediate_size=int(_require(cfg, "moe_intermediate_size", "target")),
                        router="gemma4", activation="gelu_tanh")
    cfg.setdefault("head_dim", 256)
    cfg.setdefault("num_key_value_heads", 4)
    cfg.setdefault("eos_token_id", 1)
    cfg.setdefault("bos_token_id", 2)
    dims = {**_dims(cfg, "target"), "rope": resolve_rope({"rope_parameters": sliding_rope})}
    return TargetConfig(
        architecture="gemma4", **dims, global_rope=global_rope,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)), qk_norm=True,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 131072)),
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=_eos_ids(cfg), layer_types=tuple(types), moe=moe,
        sliding_window=cfg.get("sliding_window", 512), global_head_dim=head_dim, global_kv_heads=global_kv,
        attention_k_eq_v=bool(cfg.get("attention_k_eq_v", False)),
        kv_shared_layers=int(cfg.get("num_kv_shared_layers") or 0), per_layer_input_size=ple,
        per_layer_vocab_size=int(cfg.get("vocab_size_per_layer_input", 262144) or 0) if ple else 0,
        double_wide_mlp=bool(cfg.get("use_double_wide_mlp", False)), hidden_act="gelu_tanh",
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
    )


def runtime_json_section(runtime: dict) -> dict:
    """ORT-GenAI style `{"model": {"dflash2" | "dspark": {...}}}` → drafter keys (+ `kind`)."""
    model = runtime.get("model", {})
    present = [k for k in ("dflash2", "dspark") if k in model]
    if len(present) == 2:
        raise ConfigError("runtime JSON has both model.dflash2 and model.dspark; they are aliases, keep one")
    if not present:
        raise ConfigError("runtime JSON has neither model.dflash2 nor model.dspark")
    section = dict(model[present[0]])
    section["kind"] = present[0]
    if "top_k" in section:
        section.setdefault("selector_top_k", section.pop("top_k"))
    return section


def canonical_tensor_names(tensors: dict) -> dict:
    """Rename bare / suffix-less head tensors to the module-qualified names the model uses; drop
    tensors only training reads (speculators' frozen verifier head and norm)."""
    out = {k: v for k, v in tensors.items() if k not in TRAINING_ONLY_TENSORS}
    for canonical, spellings in MARKOV_TENSORS.items():
        present = [s for s in spellings if s in out]
        if len(present) > 1:
            raise ConfigError(f"tensor {canonical} is spelled twice: {present}")
        if present and present[0] != canonical:
            log.info("renaming tensor %s -> %s", present[0], canonical)
            out[canonical] = out.pop(present[0])
    return out


def flatten_speculators(cfg: dict) -> dict:
    """A vLLM speculators config (`speculators_model_type`, `transformer_layer_config`) -> flat keys."""
    if "transformer_layer_config" not in cfg and "speculators_model_type" not in cfg:
        return cfg
    kind = cfg.get("speculators_model_type")
    if kind not in SPECULATORS_KINDS:
        raise ConfigError(f"speculators_model_type={kind!r} is not a block drafter "
                          f"(supported: {sorted(SPECULATORS_KINDS)})")
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ConfigError("speculators config has no transformer_layer_config object (the drafter's decoder shape)")
    flat = {**layer, **{k: v for k, v in cfg.items() if k != "transformer_layer_config"}}
    flat.setdefault("speculators_kind", SPECULATORS_KINDS[kind])
    return flat


def resolve_drafter(cfg: dict, tensor_shapes: dict[str, tuple[int, ...]], mode: str | None = None,
                    runtime: dict | None = None) -> DrafterConfig:
    """Build the one DrafterConfig from config.json, tensor shapes, an explicit mode and runtime JSON."""
    cfg = flatten_speculators(cfg)
    for key, what in REFUSED_KEYS.items():
        if key in cfg:
            raise ConfigError(f"config key {key!r} ({what}) changes drafting and is not supported")
    merged = dict(cfg)
    if runtime is not None:
        section = runtime_json_section(runtime)
        merged["runtime"] = section
    kind = _resolve_kind(merged, tensor_shapes, mode)
    dims = _dims(cfg, "drafter")
    gemma = _gemma_drafter(cfg, tensor_shapes)
    if gemma:
        dims.update(gemma)

    def field(name: str, default: Any = _MISSING) -> Any:
        value = read_field(merged, name)
        if value is _MISSING:
            if default is _MISSING:
                raise ConfigError(f"drafter config has no {name} (looked in {DRAFTER_SPELLINGS[name]}); "
                                  "taps and geometry are never guessed")
            return default
        return value

    markov_rank = _markov_rank(merged, tensor_shapes)
    conf_enabled = bool(field("enable_confidence_head", False)) or "confidence_head.proj.weight" in tensor_shapes
    layer_types = tuple(cfg.get("layer_types") or ("full_attention",) * dims["num_layers"])
    softcap = field("final_logit_softcapping", None)
    return DrafterConfig(
        kind=kind, **dims,
        target_layer_ids=tuple(int(i) for i in field("target_layer_ids")),
        mask_token_id=int(field("mask_token_id")),
        block_size=int(field("block_size")),
        shift_label=bool(field("shift_label", kind == "dspark")),
        num_draft_tokens=int(field("num_draft_tokens", 0)),
        layer_types=layer_types,
        sliding_window=cfg.get("sliding_window"),
        use_sliding_window=cfg.get("use_sliding_window") is not False,
        is_causal=cfg.get("is_causal"),
        input_embedding_scale=float(field("input_embedding_scale", 1.0)),
        output_multiplier=float(field("output_multiplier", 1.0)),
        final_logit_softcapping=None if softcap is None else float(softcap),
        markov_rank=markov_rank,
        markov_head_type=str(field("markov_head_type", "vanilla")),
        enable_confidence_head=conf_enabled,
        confidence_head_with_markov=bool(field("confidence_head_with_markov", True)),
        confidence_bias="confidence_head.proj.bias" in tensor_shapes or not tensor_shapes,
        conv_kernel_size=int(field("conv_kernel_size", 0)),
        conv_group_size=int(field("conv_group_size", 0)),
        selector_top_k=int(field("selector_top_k", 0)),
        selector_rank=int(field("selector_rank", 0)),
        own_embed_tokens="embed_tokens.weight" in tensor_shapes,
        own_lm_head="lm_head.weight" in tensor_shapes,
        tap_point=str(field("tap_point", default_tap_point(kind))),
        draft_vocab_size=_draft_vocab_size(merged, tensor_shapes, dims["vocab_size"]),
        rope_interleaved=_rope_interleaved(cfg),
        gemma_blocks=bool(gemma), attention_k_eq_v=bool(gemma) and bool(cfg.get("attention_k_eq_v", False)),
    )


def _gemma_drafter(cfg: dict, shapes: dict[str, tuple[int, ...]]) -> dict:
    """DeepSpec's Gemma 4 DSpark (`Gemma4DSparkModel`, a copy of the target's Gemma 4 text config): every
    drafter layer is a non-causal full-attention layer with the target's full-attention geometry and RoPE
    (`_gemma4_full_layers`) and its own √H-scaled embedding. {} for any other drafter."""
    archs = cfg.get("architectures") or []
    if not (any(a.startswith("Gemma4") for a in archs) or str(cfg.get("model_type", "")).startswith("gemma4")):
        return {}
    layers = int(_require(cfg, "num_hidden_layers", "drafter"))
    types = cfg.get("layer_types") or ["full_attention"] * layers
    if any(t != "full_attention" for t in types):
        raise ConfigError(f"drafter Gemma4DSparkModel layer_types must all be full_attention (its layers attend over "
                          f"the whole context), got {types}")
    if "embed_tokens.weight" not in shapes:
        raise ConfigError("drafter Gemma4DSparkModel ships no embed_tokens.weight: its block embedding is its own, "
                          "scaled by √hidden_size (the target's unscaled one would silently change its drafts)")
    head_dim, kv, rope = _gemma4_full_layers(cfg, list(range(layers)))
    return {"head_dim": head_dim, "rope": rope, **({} if kv is None else {"num_kv_heads": kv})}


def _rope_interleaved(cfg: dict) -> bool:
    """`rope_is_neox_style: false` (LiquidAI's DSpark drafters; SGLang also reads `is_neox_style`)."""
    values = {k: cfg[k] for k in ("rope_is_neox_style", "is_neox_style") if k in cfg}
    for key, value in values.items():
        if not isinstance(value, bool):
            raise ConfigError(f"drafter {key} must be true or false, got {value!r}")
    if len(set(values.values())) > 1:
        raise ConfigError(f"drafter config disagrees on the RoPE layout: {values}")
    return next(iter(values.values()), True) is False


def _draft_vocab_size(cfg: dict, shapes: dict, vocab: int) -> int:
    """0 (whole vocabulary) or the pruned size; config, d2t/t2d and lm_head rows must agree."""
    configured = read_field(cfg, "draft_vocab_size")
    d2t, t2d, head = shapes.get("d2t"), shapes.get("t2d"), shapes.get("lm_head.weight")
    if (d2t is None) != (t2d is None):
        raise ConfigError(f"vocabulary map is incomplete: need both d2t and t2d (found d2t={d2t}, t2d={t2d})")
    if d2t is None:
        if head is not None and head[0] != vocab:
            raise ConfigError(f"lm_head.weight has {head[0]} rows for vocab_size={vocab} and no d2t/t2d "
                              "maps a draft vocabulary onto the target's")
        if configured is not _MISSING and int(configured) not in (0, vocab) and shapes:
            raise ConfigError(f"draft_vocab_size={configured} but the weights have no d2t/t2d vocabulary map")
        return 0 if configured is _MISSING or int(configured) == vocab or shapes else int(configured)
    size = d2t[0]
    if t2d[0] != vocab:
        raise ConfigError(f"t2d has {t2d[0]} entries but vocab_size={vocab}")
    if configured is not _MISSING and int(configured) != size:
        raise ConfigError(f"draft_vocab_size={configured} in config but d2t has {size} entries")
    if head is not None and head[0] != size:
        raise ConfigError(f"lm_head.weight has {head[0]} rows but the draft vocabulary (d2t) has {size}")
    return size


def _has_dspark_heads(cfg: dict, shapes: dict) -> list[str]:
    evidence = [n for n in shapes if n.startswith(("markov_head.", "confidence_head."))]
    for name in ("markov_rank", "enable_confidence_head"):
        value = read_field(cfg, name)
        if value is not _MISSING and value:
            evidence.append(f"{name}={value}")
    return evidence


def _resolve_kind(cfg: dict, shapes: dict, mode: str | None) -> str:
    sources: list[tuple[str, str]] = []
    if mode is not None:
        if mode not in DRAFTER_KINDS:
            raise ConfigError(f"--mode {mode!r} is not a drafter kind (choose from {DRAFTER_KINDS})")
        sources.append(("--mode", mode))
    runtime = cfg.get("runtime")
    if runtime:
        sources.append((f"runtime JSON model.{runtime['kind']}", runtime["kind"]))
    if "speculators_kind" in cfg:
        sources.append((f"speculators_model_type={cfg['speculators_kind']}", cfg["speculators_kind"]))
    projector = _lookup(cfg, "dflash_config.projector_type")
    for arch in cfg.get("architectures") or []:
        if arch == "DFlashDraftModel" and projector == "dspark":
            continue  # SpecForge trains DSpark as a DFlash model with a dspark projector
        if arch in ARCHITECTURE_KINDS:
            sources.append((f"architectures={arch}", ARCHITECTURE_KINDS[arch]))
        elif "DSpark" in arch:
            sources.append((f"architectures={arch}", "dspark"))
    if projector == "dspark":
        sources.append(("dflash_config.projector_type", "dspark"))
    heads = _has_dspark_heads(cfg, shapes)
    if heads:
        sources.append((f"DSpark heads ({', '.join(heads[:3])})", "dspark"))
    if not sources:
        raise ConfigError("cannot tell the drafter kind: no --mode, no known architectures "
                          f"(known: {sorted(ARCHITECTURE_KINDS)}), no DSpark heads")
    first_src, kind = sources[0]
    for src, other in sources[1:]:
        if other != kind:
            if "dspark" in (kind, other):
                raise ConfigError(f"{first_src} says {kind!r} but {src} says {other!r}; a drafter with "
                                  "DSpark heads must run in 'dspark' mode (--mode dspark), never as plain DFlash")
            raise ConfigError(f"conflicting drafter kind: {first_src} says {kind!r}, {src} says {other!r}")
    return kind


def _markov_rank(cfg: dict, shapes: dict) -> int:
    configured = read_field(cfg, "markov_rank")
    w1 = shapes.get("markov_head.markov_w1.weight")
    w2 = shapes.get("markov_head.markov_w2.weight")
    if (w1 is None) != (w2 is None):
        raise ConfigError("Markov head is incomplete: need both markov_w1 and markov_w2 "
                          f"(found markov_w1={w1}, markov_w2={w2})")
    if w1 is None:
        return 0 if configured is _MISSING else int(configured)
    rank = w1[1]
    if rank == 0 or w2[1] == 0:
        raise ConfigError(f"Markov head weights resolve to rank 0 (markov_w1 {w1}, markov_w2 {w2}); "
                          "refusing to drop the head")
    if w2[1] != rank:
        raise ConfigError(f"markov_w1 rank {rank} != markov_w2 rank {w2[1]}")
    if configured is not _MISSING and int(configured) != rank:
        raise ConfigError(f"markov_rank={configured} in config but the weights have rank {rank}")
    return rank
