"""Vocabulary operations the decoding algorithm uses on logits that may be split across ranks.

A DSpark head's `vocab` says how its output ids are laid out: `FULL` (one process holds
every id) here, or the tensor-parallel shard ops that `parallel/` attaches to a sharded head
(global argmax and top-K, gathered distributions, sums over ranks). The chain, the lattice and
the proposal call these and never ask which layout they have.
"""

from __future__ import annotations

import torch

from . import cpu_kernels


def argmax_ids(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(-1)` (ties → lowest id; a NaN row's first NaN). On an AVX512 CPU the kernel's one pass
    (`cpu_kernels.argmax`: a verify's 9 x 65,536 bf16 logits in ~0.07 ms, torch's ~0.5); elsewhere torch's, bf16
    rows widened first (the same index, and faster than its bf16 argmax)."""
    if (picked := cpu_kernels.argmax(x)) is not None:
        return picked
    return (x.float() if x.dtype == torch.bfloat16 else x).argmax(dim=-1)


def topk_lowest_id(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim, best first, equal values in ascending id order (ONNX TopK's rule;
    torch.topk leaves tie order unspecified). In an export the graph's TopK gives that order."""
    if torch.onnx.is_in_onnx_export():
        return torch.topk(x, k, dim=-1)
    values, ids = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], ids[..., :k]


class FullVocab:
    """Every id in this process: logits [.., V] are the whole row."""

    sharded = False

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        return argmax_ids(x)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """The whole row (a shard layout gathers it)."""
        return x

    def topk(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return topk_lowest_id(x.float(), k)

    def at(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [.., V] read at ids [..] -> [..] fp32."""
        return torch.gather(x.float(), -1, ids[..., None])[..., 0]

    def rows(self, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Rows of a [V, r] weight at ids [..] -> [.., r] fp32 (a shard gives zeros for ids it lacks)."""
        return weight[ids].float()

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of per-rank partial results (one process: x itself)."""
        return x


FULL = FullVocab()
