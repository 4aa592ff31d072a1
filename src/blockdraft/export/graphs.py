"""The two graphs an export holds, in ONNX Runtime GenAI 0.18's paged I/O contract
(`docs/ortgenai_contract.md`), as torch modules over blockdraft's own layers.

TargetGraph: packed `input_ids [T]` + sequence metadata + paged K/V pools -> `logits [T, V]`,
the drafter's packed taps `aux_hidden_states [T, F]` and the pools with the new rows written.

DrafterGraph: the newly committed context rows' taps `aux_hidden_states [C, F]`, the blocks'
`input_ids [NB·B]` (anchor, mask, ...), the row maps and metadata of the packed stream
(per request: its context rows, then its block rows) + the drafter's pools -> the candidate
lattice (`draft_candidate_ids` int32 [NB, n, K], `draft_scores` fp32 [NB, n, K, K]) and the
pools. Context rows' K/V come from `hidden_norm(fc(taps))`, block rows' from the layer's own
normed rows; both are written at their positions, and block rows attend to their request's
rows below `past + query length` by the layer's rule (non-causal, or causal within a window).
Block rows' K/V are scratch: the next step's context rows overwrite them.
"""

from __future__ import annotations

import torch
from torch import nn

from ..cache.views import causal_visibility
from ..config import Taps
from ..layers.attention import attend
from ..models.drafter import BlockDrafter
from ..models.target import TargetModel
from ..spec_decode.propose import block_lattice
from .paged import PagedGraphStep, packed_rows


class TargetGraph(nn.Module):
    def __init__(self, target: TargetModel, taps: Taps):
        super().__init__()
        self.target, self.tap_layers = target, taps

    def forward(self, input_ids, cu_seqlens, past_lens, block_table, attention_metadata, *past):
        request, position, lengths = packed_rows(cu_seqlens, past_lens, input_ids)
        step = PagedGraphStep(request, position, lengths, block_table, list(past))
        out = self.target(input_ids[None], step, self.tap_layers)
        return (out.logits[0], out.taps[0], *step.presents)


class DrafterGraph(nn.Module):
    def __init__(self, drafter: BlockDrafter, top_k: int):
        super().__init__()
        self.drafter, self.top_k = drafter, top_k
        # registered so the exporter emits them as named initializers, which share_initializers then
        # stores once for both graphs (they are the target's own tensors)
        self.shared_embed_tokens, self.shared_lm_head = drafter.shared.embed_tokens, drafter.shared.lm_head

    def forward(self, aux_hidden_states, input_ids, q_row_map, qkv_row_map, block_row_index, cu_seqlens,
                past_lens, block_table, attention_metadata, *past):
        d = self.drafter
        rows = d.config.block_size
        ctx = d.hidden_norm(d.fc(aux_hidden_states.to(d.dtype)))                      # [C, D]
        request, position, lengths = packed_rows(cu_seqlens, past_lens, qkv_row_map)  # [T], [T], [b]
        block_req, block_pos = request[block_row_index.long()], position[block_row_index.long()]   # [NB·B]
        cos_kv, sin_kv = d.rotary.cos_sin(position[None], d.dtype)                    # every packed row
        cos_q, sin_q = d.rotary.cos_sin(block_pos[None], d.dtype)                     # block rows
        x = d.embed(input_ids).to(d.dtype).view(-1, rows, ctx.shape[-1])               # [NB, B, D]
        step = PagedGraphStep(request, position, lengths, block_table, list(past), block_req, block_pos)
        for i, layer in enumerate(d.layers):
            visible = step.visible_for(lambda q, k, layer=layer: causal_visibility(q, k, layer.window, layer.causal))

            def paged_attention(attn, h, i=i, visible=visible):
                flat = h.reshape(-1, h.shape[-1])                                     # [NB·B, D]
                source = torch.cat([flat, ctx])[qkv_row_map.long()]                   # [T, D] K/V rows
                k, v = step.kv(i, *attn.context_kv(source[None], cos_kv, sin_kv))     # the pages, written
                q = attn.queries(flat[None], cos_q, sin_q)                            # [1, h, NB·B, d]
                return attn.o_proj(attend(q, k, v, visible, attn.scale)).view(h.shape)

            x = layer(x, paged_attention)
        hidden = d.norm(x)                                                            # [NB, B, D]
        lattice = block_lattice(d, hidden, input_ids.view(-1, rows)[:, 0], self.top_k)
        return (lattice.candidate_ids.to(torch.int32), lattice.scores, *step.presents)
