"""Tensor-parallel building blocks and shard-aware vocabulary ops.

Each rank holds a slice: column-parallel projections a block of output features (whole
heads), row-parallel projections the matching input features (their partial products
are summed with one all-reduce), vocab-parallel embedding / LM head a contiguous block
of token ids `[lo, hi)`. Collectives run in fp32 (gloo has no bf16 reduction).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ..layers.linear import stable_linear
from ..layers.vocab import topk_lowest_id


@dataclass(frozen=True)
class TPGroup:
    rank: int
    world: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        dist.all_reduce(y)
        return y.to(x.dtype)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's x along `dim` (rank order)."""
        y = x.float().contiguous()
        parts = [torch.empty_like(y) for _ in range(self.world)]
        dist.all_gather(parts, y)
        return torch.cat(parts, dim=dim).to(x.dtype)

    def split(self, n: int) -> tuple[int, int]:
        """This rank's [lo, hi) of n items split evenly (divisibility is checked before launch)."""
        per = n // self.world
        return self.rank * per, (self.rank + 1) * per


class ColumnParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, lo: int, hi: int):
        super().__init__()
        self.weight = nn.Parameter(full.weight.detach()[lo:hi].clone(), requires_grad=False)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach()[lo:hi].clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return stable_linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, lo: int, hi: int, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(full.weight.detach()[:, lo:hi].clone(), requires_grad=False)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(stable_linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class _VocabRows(nn.Module):
    """Rows [lo, hi) of a vocabulary-sized weight (this rank's shard)."""

    def __init__(self, full: nn.Module, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.lo, self.hi = tp.split(full.weight.shape[0])
        self.weight = nn.Parameter(full.weight.detach()[self.lo:self.hi].clone(), requires_grad=False)


class VocabParallelEmbedding(_VocabRows):
    """Rows [lo, hi) of the table; ids outside the shard contribute zeros, one all-reduce sums."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        inside = (ids >= self.lo) & (ids < self.hi)
        local = F.embedding((ids - self.lo).clamp(0, self.hi - self.lo - 1), self.weight)
        return self.tp.all_reduce(local * inside[..., None].to(local.dtype))


class VocabParallelHead(_VocabRows):
    """LM head rows [lo, hi): `local` gives this rank's logit shard, `forward` the gathered full logits."""

    def local(self, x: torch.Tensor) -> torch.Tensor:
        return stable_linear(x, self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather(self.local(x))


def shard_argmax(local: torch.Tensor, lo: int, tp: TPGroup) -> torch.Tensor:
    """Global argmax over vocab shards [.., V/tp] -> global ids [..]; ties go to the lowest id
    (torch's argmax takes the first maximum within a shard; across shards the lowest rank wins)."""
    value, index = local.float().max(dim=-1)
    values = tp.all_gather(value[..., None])                                   # [.., world]
    ids = tp.all_gather((index + lo).float()[..., None]).long()                # exact for ids < 2^24
    best = values.argmax(dim=-1, keepdim=True)                                 # first max = lowest rank
    return ids.gather(-1, best)[..., 0]


def shard_topk(local: torch.Tensor, k: int, lo: int, tp: TPGroup) -> tuple[torch.Tensor, torch.Tensor]:
    """Global top-k over vocab shards: values, ids [.., k] sorted best first, ties by lowest id."""
    kk = min(k, local.shape[-1])
    value, index = topk_lowest_id(local.float(), kk)
    values = tp.all_gather(value)                                               # [.., world * kk]
    ids = tp.all_gather((index + lo).float()).long()
    # sort by value descending, then id ascending: stable sort on id first, then on -value
    order = ids.argsort(dim=-1, stable=True)
    values, ids = values.gather(-1, order), ids.gather(-1, order)
    order = (-values).argsort(dim=-1, stable=True)[..., :k]
    return values.gather(-1, order), ids.gather(-1, order)


class ShardedVocab:
    """The vocabulary ops (`layers/vocab.py`) of a head that holds ids [lo, hi) on this rank."""

    sharded = True

    def __init__(self, tp: TPGroup, lo: int, hi: int):
        self.tp, self.lo, self.hi = tp, lo, hi

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        return shard_argmax(x, self.lo, self.tp)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather(x)

    def topk(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return shard_topk(x, k, self.lo, self.tp)

    def _local(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (ids - self.lo).clamp(0, self.hi - self.lo - 1), (ids >= self.lo) & (ids < self.hi)

    def at(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        local, mine = self._local(ids)       # each id's value lives on one rank
        return self.tp.all_reduce(torch.gather(x.float(), -1, local[..., None])[..., 0] * mine)

    def rows(self, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        local, mine = self._local(ids)
        return weight[local].float() * mine[..., None]

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(x)
