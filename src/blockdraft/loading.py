"""Directories → ready models: `load_models(target_dir, drafter_dir)` → `LoadedModels`, or one at a
time, `load_target(dir)` and `load_drafter(dir, target)`.

Reads config.json (+ an optional ORT-GenAI `genai_config.json`), resolves it once
into a frozen config, checks it against the target, builds on the meta device
and assigns the safetensors. Everything that can be wrong with a checkpoint is
reported here, before any generation starts. What loading learned that is not the modules' own
(where they came from, what the checkpoint held that the decoder does not run, the numerics and
kernels chosen) is in the `LoadedModels` record.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from .checkpoints.resolve import canonical_tensor_names, resolve_drafter, resolve_target
from .checkpoints.rope_layout import reorder_rotated
from .checkpoints.weights import assign_weights, load_state_dict, read_json, strip_prefix, tensor_names
from .config import DrafterConfig, TargetConfig
from .errors import ConfigError
from .layers.linear import plan_linears
from .layers.quant import check_scheme, kernels_in, quantize_drafter, quantize_target, scheme_of
from .models.drafter import BlockDrafter
from .models.registry import family_of
from .models.target import TargetModel
from .numerics import torch_dtype

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoadedModels:
    """A target and its drafter as loaded, with what loading learned about them."""

    target: TargetModel
    drafter: BlockDrafter | None
    target_dir: Path
    drafter_dir: Path | None
    skipped_tensors: dict[str, int]     # checkpoint tensors the text decoder does not run, counted by prefix
    quantization: str                   # the target's weight scheme ("none", "int8", "int4", "int4-a8")
    kernel: str | None                  # the kernels its quantized layers run, e.g. "qgemm amx" (None: unquantized)


def load_models(target_dir: str | Path, drafter_dir: str | Path | None = None, dtype: str | torch.dtype = "float32",
                quantization: str | None = None, device: str | torch.device = "cpu", mode: str | None = None,
                block_size: int | None = None) -> LoadedModels:
    """The target in `target_dir` (`load_target`) and, where given, the drafter in `drafter_dir` bound to it
    (`load_drafter`), as one record."""
    target_dir = Path(target_dir)
    target, skipped = _load_target(target_dir, dtype, quantization, device)
    scheme = scheme_of(target)
    alone = LoadedModels(target, None, target_dir, None, skipped, scheme,
                         kernels_in(target) if scheme != "none" else None)
    return with_drafter(alone, drafter_dir, mode, block_size)


def with_drafter(models: LoadedModels, drafter_dir: str | Path | None, mode: str | None = None,
                 block_size: int | None = None) -> LoadedModels:
    """`models`' target (the same tensors, not a copy) with the drafter in `drafter_dir` (None: none) bound to it."""
    drafter = None if drafter_dir is None else load_drafter(drafter_dir, models.target, mode, block_size,
                                                             target_dir=models.target_dir)
    return dataclasses.replace(models, drafter=drafter, drafter_dir=None if drafter_dir is None else Path(drafter_dir))


def check_shareable(models: LoadedModels, target_dir: Path, dtype: str, quantization: str,
                    device: str | torch.device, tensor_parallel: bool) -> None:
    """Refuse, naming the field, to run `models`' loaded target for a request of another target or numerics."""
    if tensor_parallel:
        raise ConfigError("share_target with tensor parallelism: sharding changes the shared target's layers")
    def place(d) -> str:                                   # "cuda" is "cuda:0", as the loaded tensors say
        d = torch.device(d)
        return d.type if d.type == "cpu" else f"{d.type}:{d.index or 0}"

    asked = {"target": Path(target_dir).resolve(), "dtype": torch_dtype(dtype), "quantization": quantization,
             "device": place(device)}
    loaded = {"target": Path(models.target_dir).resolve(), "dtype": models.target.dtype,
              "quantization": models.quantization, "device": place(models.target.device)}
    for field, value in asked.items():
        if value != loaded[field]:
            raise ConfigError(f"share_target: {field} {value} asked, but the shared target was loaded with "
                              f"{field} {loaded[field]}")


def load_target(model_dir: str | Path, dtype: str | torch.dtype = "float32",
                quantization: str | None = None, device: str | torch.device = "cpu") -> TargetModel:
    """A HF causal-LM directory (config.json + safetensors, sharded or not; `supported-models.md` lists the
    architectures) -> TargetModel. `quantization` int8 / int4: weight-only layers (`layers/quant.py`),
    bf16 activations, CPU."""
    return _load_target(Path(model_dir), dtype, quantization, device)[0]


def _load_target(model_dir: Path, dtype: str | torch.dtype, quantization: str | None,
                 device: str | torch.device) -> tuple[TargetModel, dict[str, int]]:
    """`load_target`, and the checkpoint's tensors it set aside, counted by prefix."""
    scheme = check_scheme(quantization, torch_dtype(dtype), device)
    cfg = resolve_target(read_json(model_dir / "config.json"))
    cfg = dataclasses.replace(cfg, eos_token_ids=_generation_eos(model_dir, cfg.eos_token_ids))
    tensors, skipped = _target_names(load_state_dict(model_dir), cfg)
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = TargetModel(cfg)
    optional = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    assign_weights(model, tensors, torch_dtype(dtype), f"target {model_dir}", optional)
    model.tie_weights()
    quantize_target(model, scheme)
    model.to(device)
    plan_linears(model)                              # measure the row-invariant kernel plans now
    return model.eval().requires_grad_(False), skipped


def _generation_eos(model_dir: Path, eos: tuple[int, ...]) -> tuple[int, ...]:
    """The end-of-sequence ids generation stops at: `generation_config.json`'s `eos_token_id` (what
    transformers' `generate` stops at — gpt-oss lists <|return|>, <|endoftext|> and <|call|> there, Gemma 4
    its end-of-turn token), then config.json's."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return eos
    ids = read_json(path).get("eos_token_id")
    ids = [] if ids is None else ids if isinstance(ids, list) else [ids]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ConfigError(f"{path}: eos_token_id must be a token id or a list of them, got {ids!r}")
    return tuple(dict.fromkeys([*ids, *eos]))


# tensors a published checkpoint carries that the text decoder does not run, by prefix (after the
# language-model prefix is removed): the vision tower and the multi-token-prediction head
SKIPPED_TARGET_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.", "model.vision_tower.",
                           "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")


def _target_names(tensors: dict[str, torch.Tensor],
                  cfg: TargetConfig) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """HF names (`model.layers.0...`, `model.language_model.layers.0...`, `lm_head.weight`) -> module
    names; drop rotary buffers; set aside (and count) the vision tower and MTP tensors; then the
    family's own step (`Family.tensor_names`: stacked experts, renamed modules, tensors it never runs)."""
    out, skipped = {}, {}
    for name, t in tensors.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        prefix = next((p for p in SKIPPED_TARGET_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            skipped[prefix + "*"] = skipped.get(prefix + "*", 0) + 1
            continue
        for p in ("model.language_model.", "model."):
            if name.startswith(p):
                name = name[len(p):]
                break
        out[name] = t
    return family_of(cfg.architecture).tensor_names(out, cfg, skipped), skipped


def check_drafter_fits(cfg: DrafterConfig, target: TargetConfig, shapes: dict[str, tuple]) -> None:
    """docs/design.md §3 load-time checks of a drafter against its target, each naming the values."""
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        raise ConfigError(f"target_layer_ids {list(cfg.target_layer_ids)}: {bad} outside the target's "
                          f"[0, {target.num_layers}) layers")
    fc = shapes.get("fc.weight")
    expected = len(cfg.target_layer_ids) * target.hidden_size
    if fc is not None and fc[1] != expected:
        raise ConfigError(f"fc.weight input width {fc[1]} != len(target_layer_ids)={len(cfg.target_layer_ids)} "
                          f"x target hidden_size={target.hidden_size} = {expected}")
    if not cfg.own_lm_head and cfg.vocab_size != target.vocab_size:
        raise ConfigError(f"drafter vocab_size={cfg.vocab_size} != target vocab_size={target.vocab_size} "
                          "but the drafter reuses the target's LM head")
    if (not cfg.own_lm_head or not cfg.own_embed_tokens) and cfg.hidden_size != target.hidden_size:
        raise ConfigError(f"drafter hidden_size={cfg.hidden_size} != target hidden_size={target.hidden_size} "
                          "but the drafter reuses the target's embedding/LM head")
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise ConfigError(f"mask_token_id={cfg.mask_token_id} outside the target vocabulary [0, {target.vocab_size})")


def refuse_embedded_drafter(drafter_dir: Path, target_dir: Path | None) -> None:
    """A DSpark draft embedded in its target checkpoint (DeepSeek-V4's `mtp.*` namespace, TensorRT-LLM's
    deployment-form probe) is not a standalone drafter: name it, never load it as one."""
    same = target_dir is not None and Path(target_dir).resolve() == drafter_dir.resolve()
    embedded = [n for n in tensor_names(drafter_dir) if n.startswith(("mtp.", "model.mtp."))]
    if embedded:
        raise ConfigError(f"{drafter_dir} carries an embedded DSpark drafter ({len(embedded)} tensors under mtp.*, "
                          f"e.g. {embedded[0]}): that is DeepSeek-V4's in-checkpoint form, and blockdraft has no "
                          "DeepSeek-V4 target; pass a standalone drafter directory (DFlash / DFlash2 / DSpark)")
    if same:
        raise ConfigError(f"--drafter {drafter_dir} is the target itself and declares no embedded draft "
                          "weights (mtp.*); pass a standalone drafter directory or --drafter none")


def load_drafter(drafter_dir: str | Path, target: TargetModel, mode: str | None = None,
                 block_size: int | None = None, target_dir: str | Path | None = None) -> BlockDrafter:
    """A z-lab DFlash / DFlash2 or DeepSeek DSpark directory -> BlockDrafter bound to `target`, in the
    target's numerics. `block_size` overrides the trained block length (as `dflash_generate(block_size=...)`
    does); `target_dir`, where known, is refused as a drafter directory unless it embeds a drafter.
    """
    drafter_dir = Path(drafter_dir)
    raw = read_json(drafter_dir / "config.json")
    refuse_embedded_drafter(drafter_dir, None if target_dir is None else Path(target_dir))
    runtime_path = drafter_dir / "genai_config.json"
    runtime = read_json(runtime_path) if runtime_path.is_file() else None
    tensors = canonical_tensor_names(strip_prefix(load_state_dict(drafter_dir), "model.", "drafter"))
    for name, dtype_ in (("d2t", torch.long), ("t2d", torch.bool)):   # stored as any integer / float type
        if name in tensors:
            tensors[name] = tensors[name].to(dtype_)
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    cfg = resolve_drafter(raw, shapes, mode=mode, runtime=runtime)
    if block_size is not None:
        cfg = dataclasses.replace(cfg, block_size=block_size, num_draft_tokens=0)
    check_drafter_fits(cfg, target.config, shapes)
    if cfg.rope_interleaved:
        tensors = reorder_rotated(tensors, cfg.head_dim)
    with torch.device("meta"):
        drafter = BlockDrafter(cfg, target)
    assign_weights(drafter, tensors, target.dtype, f"drafter {drafter_dir}")
    drafter.to(target.device)                        # the drafter lives where its target does
    quantize_drafter(drafter, scheme_of(target))     # ... and in its numerics
    drafter.check_vocab_map(f"drafter {drafter_dir}")
    plan_linears(drafter)
    return drafter.eval().requires_grad_(False)
