"""Config spellings → one frozen `TargetConfig` / `DrafterConfig` (docs/design.md §3).

A target's config is resolved by the family that owns its architecture (`models/registry.py`,
`models/families/`). Each drafter field has a table of places it may be spelled; every place that is
present is read, and they must agree (first found wins only when they do).
Keys that matter only for training are ignored; keys that would change drafting
and are not implemented are refused by name.
"""

from __future__ import annotations

import logging
from typing import Any

from ..config import DrafterConfig, TargetConfig
from ..drafters import registry as kinds
from ..errors import ConfigError
from ..models.registry import drafter_dims as family_drafter_dims
from ..models.registry import target_family
from .hf_config import decoder_dims

log = logging.getLogger(__name__)

_MISSING = object()

# field -> the places it may be spelled (a dotted key looks inside a nested section); each kind adds
# its own head fields (`DrafterKind.spellings`)
DRAFTER_SPELLINGS: dict[str, list[str]] = {
    "tap_point": ["dflash_config.tap_point", "dspark_config.tap_point", "tap_point", "dspark_tap_point"],
    "target_layer_ids": ["dflash_config.target_layer_ids", "dspark_config.target_layer_ids",
                         "target_layer_ids", "dspark_target_layer_ids", "aux_hidden_state_layer_ids"],
    "draft_vocab_size": ["draft_vocab_size", "dflash_config.draft_vocab_size", "dspark_config.draft_vocab_size"],
    "mask_token_id": ["dflash_config.mask_token_id", "dspark_config.mask_token_id", "mask_token_id",
                      "dspark_mask_token_id", "dspark_noise_token_id"],
    "block_size": ["dflash_config.block_size", "dspark_config.block_size", "block_size", "dspark_block_size"],
    "shift_label": ["shift_label", "dflash_config.shift_label", "dspark_config.shift_label", "dspark_shift_label"],
    "num_draft_tokens": ["num_draft_tokens", "dflash_config.num_draft_tokens", "dspark_config.num_draft_tokens"],
    "input_embedding_scale": ["dflash_config.input_embedding_scale", "input_embedding_scale"],
    "output_multiplier": ["dflash_config.output_multiplier", "output_multiplier"],
    "final_logit_softcapping": ["dflash_config.final_logit_softcapping", "final_logit_softcapping"],
}

DRAFTER_SPELLINGS.update({name: list(places) for name, places in kinds.spellings().items()})

# An ORT-GenAI runtime JSON section (`model.dspark` / `model.dflash2`) is one more spelling of each field.
for _name, _places in DRAFTER_SPELLINGS.items():
    _places.append(f"runtime.{_name}")

TRAINING_ONLY_TENSORS = ("verifier_lm_head.weight", "verifier_norm.weight")

# Keys that change what a drafter proposes and that blockdraft does not implement.
REFUSED_KEYS = {
    "hc_mult": "hyper-connection (DeepSeek-V4 MTP) drafters",
    "n_mtp_layers": "DeepSeek-V4 MTP stacks",
    "attn_logit_softcapping": "attention logit soft-capping",
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


def resolve_target(cfg: dict) -> TargetConfig:
    """A target's config.json -> its family's TargetConfig (`models/registry.py` picks the family)."""
    family, arch = target_family(cfg)
    quant = (cfg.get("quantization_config") or {}).get("quant_method")
    if quant is not None and quant not in family.checkpoint_quantizations:
        raise ConfigError(f"target quantization_config.quant_method={quant!r} is not supported for {arch} "
                          "(blockdraft reads bf16/fp32 checkpoints, and gpt-oss's MXFP4 experts; quantize at load "
                          "with --quantization int4|int8)")
    return family.resolve(cfg, arch)


def runtime_json_section(runtime: dict) -> dict:
    """ORT-GenAI style `{"model": {<kind>: {...}}}` (a kind it exports) → drafter keys (+ `kind`)."""
    model = runtime.get("model", {})
    sections = kinds.names(lambda kind: kind.onnx is not None)
    present = [k for k in sections if k in model]
    spelled = " and ".join(f"model.{k}" for k in sorted(present or sections))
    if len(present) > 1:
        raise ConfigError(f"runtime JSON has both {spelled}; they are aliases, keep one")
    if not present:
        raise ConfigError(f"runtime JSON has none of {spelled}")
    section = dict(model[present[0]])
    section["kind"] = present[0]
    if "top_k" in section:
        section.setdefault("selector_top_k", section.pop("top_k"))
    return section


def canonical_tensor_names(tensors: dict) -> dict:
    """Rename bare / suffix-less head tensors to the module-qualified names the model uses; drop
    tensors only training reads (speculators' frozen verifier head and norm)."""
    out = {k: v for k, v in tensors.items() if k not in TRAINING_ONLY_TENSORS}
    for canonical, spellings in kinds.tensor_spellings().items():
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
    if kind not in kinds.names():
        raise ConfigError(f"speculators_model_type={kind!r} is not a block drafter "
                          f"(supported: {sorted(kinds.names())})")
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ConfigError("speculators config has no transformer_layer_config object (the drafter's decoder shape)")
    flat = {**layer, **{k: v for k, v in cfg.items() if k != "transformer_layer_config"}}
    flat.setdefault("speculators_kind", kind)
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
    spec = kinds.drafter_kind(kind)
    dims = decoder_dims(cfg, "drafter")
    gemma = family_drafter_dims(cfg, tensor_shapes)
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

    layer_types = tuple(cfg.get("layer_types") or ("full_attention",) * dims["num_layers"])
    softcap = field("final_logit_softcapping", None)
    return DrafterConfig(
        kind=kind, **dims,
        target_layer_ids=tuple(int(i) for i in field("target_layer_ids")),
        mask_token_id=int(field("mask_token_id")),
        block_size=int(field("block_size")),
        shift_label=bool(field("shift_label", spec.shift_label)),
        num_draft_tokens=int(field("num_draft_tokens", 0)),
        layer_types=layer_types,
        sliding_window=cfg.get("sliding_window"),
        use_sliding_window=cfg.get("use_sliding_window") is not False,
        is_causal=cfg.get("is_causal"),
        input_embedding_scale=float(field("input_embedding_scale", 1.0)),
        output_multiplier=float(field("output_multiplier", 1.0)),
        final_logit_softcapping=None if softcap is None else float(softcap),
        heads=None if spec.heads_from is None else spec.heads_from(field, tensor_shapes),
        own_embed_tokens="embed_tokens.weight" in tensor_shapes,
        own_lm_head="lm_head.weight" in tensor_shapes,
        tap_point=str(field("tap_point", spec.tap_point)),
        draft_vocab_size=_draft_vocab_size(merged, tensor_shapes, dims["vocab_size"]),
        rope_interleaved=_rope_interleaved(cfg),
        gemma_blocks=bool(gemma), attention_k_eq_v=bool(gemma) and bool(cfg.get("attention_k_eq_v", False)),
    )


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


def _resolve_kind(cfg: dict, shapes: dict, mode: str | None) -> str:
    sources: list[tuple[str, str]] = []
    if mode is not None:
        if mode not in kinds.names():
            raise ConfigError(f"--mode {mode!r} is not a drafter kind (choose from {kinds.names()})")
        sources.append(("--mode", mode))
    runtime = cfg.get("runtime")
    if runtime:
        sources.append((f"runtime JSON model.{runtime['kind']}", runtime["kind"]))
    if "speculators_kind" in cfg:
        sources.append((f"speculators_model_type={cfg['speculators_kind']}", cfg["speculators_kind"]))
    projector = _lookup(cfg, "dflash_config.projector_type")
    projected = projector in kinds.names()
    for arch in cfg.get("architectures") or []:
        kind = kinds.kind_of_architecture(arch)
        if kind is not None and not (projected and kind.hosts_projectors):   # SpecForge: the projector says
            sources.append((f"architectures={arch}", kind.name))
    if projected:
        sources.append(("dflash_config.projector_type", projector))
    read = (lambda name: None if (v := read_field(cfg, name)) is _MISSING else v)
    heads = {}
    for kind in kinds.kinds():
        evidence = kind.evidence(read, shapes)
        if evidence:
            heads[kind.name] = kind.title
            sources.append((f"{kind.title} heads ({', '.join(evidence[:3])})", kind.name))
    if not sources:
        raise ConfigError("cannot tell the drafter kind: no --mode, no known architectures "
                          f"(known: {kinds.architectures()}), no drafter heads")
    first_src, kind = sources[0]
    for src, other in sources[1:]:
        if other != kind:
            headed = next((k for k in (kind, other) if k in heads), None)
            if headed is not None:
                raise ConfigError(f"{first_src} says {kind!r} but {src} says {other!r}; a drafter with "
                                  f"{heads[headed]} heads must run in {headed!r} mode (--mode {headed}), never "
                                  "as another kind")
            raise ConfigError(f"conflicting drafter kind: {first_src} says {kind!r}, {src} says {other!r}")
    return kind
