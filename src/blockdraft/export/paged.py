"""Paged attention in plain ONNX ops, in ONNX Runtime GenAI's packed I/O layout.

Every scheduled request's rows are concatenated (`[num_tokens]`, no padding);
`cumulative_sequence_lengths [batch+1]` marks where each request starts, `past_sequence_lengths
[batch]` is its committed length (the position of its first new row), `block_table [batch,
max_blocks]` its pages in logical order (padding columns, -1 or a ring's repeats, are read but
never visible: their positions lie outside every row's range). A layer's pool is
`[num_blocks, page, kv_heads, head_dim]`.

`PagedGraphStep` writes each new row at its slot (ScatterND on the pool itself, so a runtime
that binds one buffer as past and present updates it in place) and then reads every request's
pages back from the updated pool (Gather by block table): the rows of a step see each other
through the pool, as they do through PagedAttention. Attention runs over the batch's pages at
once, with a mask that keeps each query to its own request's keys.
"""

from __future__ import annotations

import torch

from ..cache.views import causal_visibility


def packed_rows(cu_seqlens: torch.Tensor, past_lens: torch.Tensor, rows_like: torch.Tensor):
    """cu [b+1], past [b], any [T, ...] tensor -> (request of each row [T], position of each row [T],
    each request's length after the step [b])."""
    t = torch.arange(rows_like.shape[0], device=cu_seqlens.device)
    request = (t[:, None] >= cu_seqlens[None, 1:].long()).sum(-1)                   # [T]
    position = past_lens.long()[request] + t - cu_seqlens.long()[request]            # [T]
    return request, position, past_lens.long() + cu_seqlens[1:].long() - cu_seqlens[:-1].long()


class PagedGraphStep:
    """The `step` a model's attention calls, over paged pools given as graph inputs.

    Rows (request, position [T]) are written; queries (query_request, query_position [Q], by
    default the rows themselves) read their request's pages. Keys at or past a request's length
    after the step (`lengths` [b]) are never visible, and are read as zeros: a runtime's pool may
    hold anything there (og.Engine does not clear its pages), and a NaN times a zero weight is NaN.
    kv(layer, k, v): k/v [1, hkv, T, d] -> the pages read back after the write, [1, hkv, b·K, d]
    with K = max_blocks·page; the written pools are kept in `presents`. `visible` is the causal
    mask; `visible_for(rule)` any other rule by position."""

    def __init__(self, request: torch.Tensor, position: torch.Tensor, lengths: torch.Tensor,
                 block_table: torch.Tensor, past: list[torch.Tensor], query_request: torch.Tensor | None = None,
                 query_position: torch.Tensor | None = None):
        self.past, self.presents = past, []
        page = past[0].shape[1]
        self.positions = position[None]                                              # [1, T]
        blocks = block_table.long()
        self.write_block = blocks[request, position // page]                         # [T]
        self.write_offset = position % page                                          # [T]
        self.read_blocks = blocks.clamp_min(0)                                       # [b, MB] (-1 pads)
        b, keys = blocks.shape[0], blocks.shape[1] * page
        self.key_pos = torch.arange(keys, device=blocks.device)[None].expand(b, keys).reshape(1, -1)  # [1, b·K]
        key_request = torch.arange(b, device=blocks.device)[:, None].expand(b, keys).reshape(-1)
        self.key_written = self.key_pos[0] < lengths[key_request]                     # [b·K]
        self.query_position = position if query_position is None else query_position
        query_request = request if query_request is None else query_request
        self.own = (query_request[:, None] == key_request[None, :]) & self.key_written[None]   # [Q, b·K]
        self.visible = self.visible_for(causal_visibility)

    def visible_for(self, rule) -> torch.Tensor:
        """rule(q_pos [1, Q], k_pos [1, K]) -> [1, 1, Q, K]; -> the mask [1, 1, Q, b·K] within requests."""
        return rule(self.query_position[None], self.key_pos) & self.own[None, None]

    def kv(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        out = []
        for pool, rows in ((self.past[2 * layer], k), (self.past[2 * layer + 1], v)):
            rows = rows[0].transpose(0, 1).to(pool.dtype)                             # [T, hkv, d]
            present = pool.index_put((self.write_block, self.write_offset), rows)     # ScatterND
            self.presents.append(present)
            read = present[self.read_blocks]                                          # [b, MB, page, hkv, d]
            read = read.reshape(-1, *read.shape[-2:])                                 # [b·K, hkv, d]
            read = torch.where(self.key_written[:, None, None], read, torch.zeros_like(read))
            out.append(read.transpose(0, 1)[None].to(k.dtype))
        return out[0], out[1]
