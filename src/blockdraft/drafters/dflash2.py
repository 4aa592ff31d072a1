"""DFlash2 (z-lab): DFlash with dynamic grouped causal convs around each layer's attention and MLP, and a
candidate selector that scores edges between consecutive slots' top-K candidates; drafts are the best walk
through that lattice.

Published as `DFlash2DraftModel`, its keys nested under `dflash_config`; ONNX Runtime GenAI's `model.dflash2`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

import torch
from torch import nn
from torch.nn import functional as F

from ..config import _positive
from ..errors import ConfigError
from ..layers.linear import StableLinear, fp32_weight
from ..layers.vocab import topk_lowest_id
from ..sampling.params import SamplingParams
from ..spec_decode.lattice import Lattice, predecessors, walk
from ..spec_decode.proposal import Proposal
from . import dflash
from .kind import DrafterKind, OnnxExport

NAME = "dflash2"


@dataclass(frozen=True)
class DFlash2Heads:
    """DFlash2's convolution and candidate-selector settings, named as z-lab's `dflash_config` spells them."""

    conv_kernel_size: int
    conv_group_size: int        # channels per dynamic-kernel group; divides hidden_size
    selector_top_k: int         # candidates per slot in the lattice, fixed by training
    selector_rank: int          # codebook / projection width of the edge scorer

    def set_fields(self) -> list[str]:
        return [f"{f.name}={getattr(self, f.name)}" for f in fields(self)]


# where published configs spell each field (`registry.spellings` adds the ONNX runtime section)
SPELLINGS = {f.name: (f"dflash_config.{f.name}", f.name) for f in fields(DFlash2Heads)}


def heads_from(read, shapes: dict) -> DFlash2Heads:
    """The settings from a published config (`read(field, default)`); a missing one reads 0 and is refused."""
    return DFlash2Heads(**{name: int(read(name, 0)) for name in SPELLINGS})


class GroupedCausalConv(nn.Module):
    """DFlash2's dynamic grouped causal conv over the block rows (zero-padded before the block).

    out[t] = sum_o (base[o] + dyn[t, o, group]) * x[t - o]; `prepare` convolves with the
    first kernel and returns the second kernel's dynamic part for `finish`.
    """

    def __init__(self, hidden: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden))
        self.kernel_projection = StableLinear(hidden, 2 * kernel_size * self.groups, bias=False)

    def _convolve(self, x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        blocks = x.view(b, t, self.groups, self.group_size)
        dynamic = dynamic.reshape(b, t, self.kernel_size, self.groups, 1)
        out = torch.zeros_like(blocks)
        for offset in range(self.kernel_size):
            shifted = blocks if offset == 0 else F.pad(blocks[:, :-offset], (0, 0, 0, 0, offset, 0))
            out = out + base[offset].view(1, 1, self.groups, self.group_size).to(x.dtype) * shifted
            out = torch.addcmul(out, dynamic[:, :, offset], shifted)
        return out.view(b, t, h)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dynamic = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, self.groups)
        return self._convolve(x, dynamic[..., 0, :, :], self.base_kernel[0]), dynamic[..., 1, :, :]

    def finish(self, x: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        return self._convolve(x, dynamic, self.base_kernel[1])


class CandidateSelector(nn.Module):
    """DFlash2 edge scorer: edge(pred, cand | h) = (P[pred] * proj(h)) · S[cand]."""

    def __init__(self, cfg):
        super().__init__()
        self.top_k = cfg.heads.selector_top_k
        rank = cfg.heads.selector_rank
        self.predecessor_codebook = nn.Embedding(cfg.vocab_size, rank)
        self.successor_codebook = nn.Embedding(cfg.vocab_size, rank)
        self.hidden_projection = StableLinear(cfg.hidden_size, rank, bias=False)


def dflash2_lattice(logits: torch.Tensor, hidden: torch.Tensor, anchor: torch.Tensor,
                    selector: CandidateSelector, to_target=None) -> Lattice:
    """Edges (P[pred] ∘ proj(h_i)) · S[cand] as DFlash2's candidate selector defines them
    (codebooks are read at target ids; `to_target` maps a pruned vocabulary's candidates)."""
    unary, cand = topk_lowest_id(logits.float(), selector.top_k)
    if to_target is not None:
        cand = to_target(cand)
    proj = F.linear(hidden.float(), fp32_weight(selector.hidden_projection.weight))   # [b, n, r]
    pred_embed = selector.predecessor_codebook.weight[predecessors(anchor, cand)].float() * proj[:, :, None]
    succ = selector.successor_codebook.weight[cand].float()
    edges = torch.einsum("bipr,bijr->bipj", pred_embed, succ)
    return Lattice(cand, unary[:, :, None, :] + edges)


def lattice(drafter, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor, top_k: int) -> Lattice:
    """The selector's own top-K (`top_k` is fixed by training: `OnnxExport.fixed_top_k`)."""
    return dflash2_lattice(logits, hidden, anchor, drafter.candidate_selector, drafter.to_target)


def propose(drafter, hidden: torch.Tensor, anchor: torch.Tensor, params: SamplingParams,
            generator: torch.Generator | None) -> Proposal:
    """Draft-slot hidden [b, n, D] -> the walk through its candidate lattice."""
    lat = lattice(drafter, hidden, drafter.logits(hidden), anchor, drafter.config.heads.selector_top_k)
    tokens, probs = walk(lat, params, generator, drafter.config.vocab_size)
    return Proposal(tokens, probs)


def check(cfg) -> None:
    heads = cfg.heads
    if heads is None:
        raise ConfigError(f"DFlash2 needs its {', '.join(SPELLINGS)}; the config has none")
    for name in SPELLINGS:
        _positive(name, getattr(heads, name))
    if cfg.hidden_size % heads.conv_group_size:
        raise ConfigError(f"conv_group_size={heads.conv_group_size} does not divide hidden_size={cfg.hidden_size}")
    if heads.selector_top_k > cfg.output_vocab_size:
        raise ConfigError(f"selector_top_k={heads.selector_top_k} exceeds the draft vocabulary "
                          f"({cfg.output_vocab_size} tokens)")


def add_heads(drafter: nn.Module, cfg) -> None:
    drafter.candidate_selector = CandidateSelector(cfg)


def layer_mixers(cfg) -> tuple[GroupedCausalConv, GroupedCausalConv]:
    kernel, group = cfg.heads.conv_kernel_size, cfg.heads.conv_group_size
    return GroupedCausalConv(cfg.hidden_size, kernel, group), GroupedCausalConv(cfg.hidden_size, kernel, group)


def published(cfg) -> dict:
    out = dflash.published(cfg)
    out["architectures"] = ["DFlash2DraftModel"]
    out["dflash_config"].update(dataclasses.asdict(cfg.heads))
    return out


CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")

KIND = DrafterKind(
    name=NAME, title="DFlash2",
    architectures=("DFlash2DraftModel",),
    shift_label=False, tap_point="hidden_states",
    check=check, add_heads=add_heads, propose=propose, publish=published, lattice=lattice,
    layer_mixers=layer_mixers, heads=DFlash2Heads, heads_from=heads_from, spellings=SPELLINGS,
    tensor_spellings={f"{c}.weight": (c, f"{c}.weight") for c in CODEBOOKS},
    suffixless=CODEBOOKS,
    onnx=OnnxExport(fixed_top_k="selector_top_k", one_window=True),
)
