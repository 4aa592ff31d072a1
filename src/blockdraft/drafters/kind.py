"""The record a drafter kind exports: its names, defaults, heads, proposal rule and every hook that differs by kind.

A kind file (`dflash.py`, `dflash2.py`, `dspark.py`) fills one `DrafterKind`; `registry.py` lists them.
The shared drafter (`models/drafter.py`), the propose step, the resolver, publishing, export, tensor
parallelism and training ask the record and never test a kind's name. This module knows no kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    import torch

    from ..config import DrafterConfig
    from ..spec_decode.lattice import Lattice
    from ..spec_decode.proposal import Proposal


@dataclass(frozen=True)
class OnnxExport:
    """How `export onnx` writes the kind as ONNX Runtime GenAI's lattice contract (`model.<kind>` section)."""

    # the field of the kind's `heads` holding the lattice width the drafter was trained for, which `--top-k` may not
    # change (None: `--top-k` chooses)
    fixed_top_k: str | None = None
    # ONNX Runtime GenAI gives every drafter layer one ring: exportable only when all layers slide with one window
    one_window: bool = False


@dataclass(frozen=True)
class Training:
    """How `blockdraft train` fits the kind."""

    # (drafter, Block, gamma=...) -> {"loss": scalar, ...parts}
    loss: Callable[..., dict[str, torch.Tensor]]
    # the loss reads the target's next-token distribution (its logits, or the teacher cache's top-k)
    distills: bool = False


def no_change(drafter, logits: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """Teacher-forced slot logits of a kind whose slots read nothing but the block."""
    return logits


@dataclass(frozen=True)
class DrafterKind:
    name: str
    # the title the kind goes by in messages ("DSpark")
    title: str
    # config.json `architectures` entries that name this kind
    architectures: tuple[str, ...]
    # default when a config does not say: slot i predicts position start+i+1 (the block is always full)
    shift_label: bool
    # the tap point (docs/design.md §2) its published drafters read when a config does not say
    tap_point: str
    # kind-specific config checks; a ConfigError names the field and the value
    check: Callable[["DrafterConfig"], None]
    # (BlockDrafter, cfg) -> registers the kind's heads on the drafter
    add_heads: Callable[[torch.nn.Module, "DrafterConfig"], None]
    # (drafter, draft-slot hidden [b, n, D], anchor [b], params, generator) -> Proposal
    propose: Callable[..., "Proposal"]
    # the kind's keys in a published config.json (architectures included)
    publish: Callable[["DrafterConfig"], dict]
    # (drafter, slot hidden [b, n, D], base logits [b, n, V], anchor [b], top_k) -> its candidate lattice
    lattice: Callable[..., "Lattice"] | None = None
    # (cfg) -> (attention mixer, MLP mixer) wrapped around a drafter layer's attention and MLP, or Nones
    layer_mixers: Callable[["DrafterConfig"], tuple[Any, Any]] = lambda cfg: (None, None)
    # (drafter, slot logits [N, V], previous true tokens [N]) -> the logits a teacher-forced slot argmaxes
    forced_logits: Callable[..., torch.Tensor] = no_change
    # the frozen dataclass of the kind's own head settings (`DrafterConfig.heads`), None for a kind
    # without settings; its `set_fields()` lists them as "field=value" (a drafter that has them must run
    # as this kind, never as another)
    heads: type | None = None
    # (read: (field, default) -> a published config's value, tensor shapes) -> its `heads` record
    heads_from: Callable[[Callable[[str, Any], Any], dict], Any] | None = None
    # head field -> the places published configs spell it (the resolver reads them like the shared fields)
    spellings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the `heads` a freshly initialised drafter of the kind gets, given the Markov rank asked for
    fresh: Callable[[int], Any] = lambda markov_rank: None
    # (read: a drafter field's value by name, None where no spelling has it; tensor shapes) -> evidence
    # that a checkpoint carries this kind's heads
    evidence: Callable[[Callable[[str], Any], dict], list[str]] = lambda read, shapes: []
    # a substring of `architectures` entries that names the kind in layouts not listed above
    architecture_hint: str | None = None
    # SpecForge trains other kinds under this kind's architecture with `dflash_config.projector_type`
    # naming the kind it really is
    hosts_projectors: bool = False
    # canonical tensor name -> the spellings published checkpoints use for it
    tensor_spellings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # tensors published without the `.weight` suffix
    suffixless: tuple[str, ...] = ()
    # state-dict tensors whose rows follow the draft vocabulary (kept rows when it is pruned)
    vocab_rows: tuple[str, ...] = ()
    # (drafter, TPGroup) -> swaps its heads for vocabulary-sharded ones (None: its heads are replicated)
    shard: Callable[..., None] | None = None
    onnx: OnnxExport | None = None
    training: Training | None = None
