"""The record a target family exports: the names it owns and every family-specific step of loading it.

A family file (`families/<family>.py`) fills one `Family`; `registry.py` lists them. Shared code —
the resolver, the loader, the `TargetModel` shell, sharding, export — asks the record (or its
`Capabilities`) and never tests an architecture string itself. This module knows no family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..checkpoints.experts import stacked_experts
from ..config import TargetConfig
from ..layers.norm import RMSNorm
from ..layers.rope import Rotary


@dataclass(frozen=True)
class Capabilities:
    """What the runtime does with the family's targets beyond decoding them one by one."""

    tensor_parallel: bool = False     # `parallel/shard.py` splits its layers across ranks (--tp > 1)
    onnx_export: bool = False         # `export/` writes its paged ONNX Runtime GenAI graphs
    fused_layer_stack: bool = False   # quantized on the CPU, every layer runs in one kernel call


@dataclass(frozen=True)
class GgufSpelling:
    """How llama.cpp names the family in a GGUF file, and the Hugging Face spelling `convert` writes."""

    architecture: str       # GGUF `general.architecture`; also the prefix of its hyper-parameter keys
    hf_architecture: str    # config.json `architectures[0]` of the converted directory
    model_type: str         # config.json `model_type` of the converted directory


@dataclass(frozen=True)
class DecoderParts:
    """What a family's layer constructor hands the `TargetModel` shell."""

    layers: nn.ModuleList
    norm: nn.Module                                       # the final norm
    rotary: Any                                           # `.cos_sin(positions, dtype)` for every layer
    extras: Mapping[str, nn.Module] = field(default_factory=dict)   # more submodules, by checkpoint name


def unchanged_embeddings(model: nn.Module, input_ids: torch.Tensor, x: torch.Tensor, step) -> torch.Tensor:
    """A family's embedding step when the first layer reads the token embeddings as they are."""
    return x


def plain_decoder(layer: Callable[[TargetConfig, int], nn.Module]) -> Callable[[TargetConfig], DecoderParts]:
    """A layer constructor from a per-layer one: `layer(cfg, i)` for every layer, an RMSNorm, one RoPE."""
    def build(cfg: TargetConfig) -> DecoderParts:
        return DecoderParts(nn.ModuleList(layer(cfg, i) for i in range(cfg.num_layers)),
                            RMSNorm(cfg.hidden_size, cfg.rms_norm_eps), Rotary(cfg.rope, cfg.rotary_dim))
    return build


@dataclass(frozen=True)
class Family:
    """One target family. `architectures` / `model_types` map the Hugging Face spellings the family owns
    to the `TargetConfig.architecture` values it resolves to (a family may own several, e.g. a dense and
    a MoE variant)."""

    name: str
    architectures: Mapping[str, str]
    model_types: Mapping[str, str]
    # config.json -> TargetConfig, given the resolved `architecture`
    resolve: Callable[[dict, str], TargetConfig]
    # TargetConfig -> its layers, final norm, RoPE and extra submodules
    decoder: Callable[[TargetConfig], DecoderParts]
    # (tensors under the model's names, config, skipped counts) -> tensors the modules take; it may set
    # tensors aside by counting them in `skipped`
    tensor_names: Callable[[dict, TargetConfig, dict], dict] = stacked_experts
    # (model, input_ids [b, t], token embeddings [b, t, H], step) -> what the first layer reads
    embed: Callable[[nn.Module, torch.Tensor, torch.Tensor, Any], torch.Tensor] = unchanged_embeddings
    # `quantization_config.quant_method` values its published checkpoints may declare
    checkpoint_quantizations: tuple[str, ...] = ()
    capabilities: Capabilities = Capabilities()
    # a drafter config that copies this family's config (DeepSpec's Gemma 4 DSpark) -> the drafter
    # dims it overrides; {} for any other drafter
    drafter_dims: Callable[[dict, dict], dict] | None = None
    # GGUF files of this family that `blockdraft convert` reads; None = not convertible
    gguf: GgufSpelling | None = None
    # the `model_type` a drafter built of this family's layers declares when it is published (z-lab's
    # and DeepSpec's drafters are Qwen3 layers); None for a family drafters are not built of
    drafter_model_type: str | None = None

    @property
    def owned(self) -> tuple[str, ...]:
        """Every `TargetConfig.architecture` value the family resolves to."""
        return tuple(dict.fromkeys([*self.architectures.values(), *self.model_types.values()]))
