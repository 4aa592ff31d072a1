"""The Hugging Face config keys every decoder spells alike: dims, RoPE, end-of-sequence ids, `text_config`.

Target family resolvers (`models/families/`) and the drafter resolver (`resolve.py`) read these through
the helpers here; a key only one family spells lives in that family's file. Each helper reads a plain
`config.json` dict and raises `ConfigError` naming the key it lacks.
"""

from __future__ import annotations

from typing import Any

from ..config import RopeConfig
from ..errors import ConfigError


def require(cfg: dict, key: str, what: str) -> Any:
    """cfg[key], or a ConfigError naming the key (and saying when it is null)."""
    if cfg.get(key) is None:
        raise ConfigError(f"{what} config.json has no {key!r}" + (" (it is null)" if key in cfg else ""))
    return cfg[key]


def resolve_rope(cfg: dict) -> RopeConfig:
    """`rope_parameters` / `rope_scaling` (or top-level `rope_theta`) -> RopeConfig."""
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


def decoder_dims(cfg: dict, what: str) -> dict:
    """The `DecoderDims` fields plus eps, RoPE and attention bias, as keyword arguments."""
    heads = int(require(cfg, "num_attention_heads", what))
    hidden = int(require(cfg, "hidden_size", what))
    return dict(
        vocab_size=int(require(cfg, "vocab_size", what)),
        hidden_size=hidden,
        intermediate_size=int(require(cfg, "intermediate_size", what)),
        num_layers=int(require(cfg, "num_hidden_layers", what)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=resolve_rope(cfg),
        attention_bias=bool(cfg.get("attention_bias", False)),
    )


def eos_ids(cfg: dict) -> tuple[int, ...]:
    """`eos_token_id` as a tuple (it may be one id, a list, or absent)."""
    eos = cfg.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))


def text_decoder(outer: dict, tie_default: bool) -> dict:
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


def check_silu(cfg: dict) -> None:
    """SwiGLU decoders: `hidden_act` must be SiLU (absent: SiLU)."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act={cfg['hidden_act']!r} is not supported (only 'silu')")
