"""The two graphs an export holds, as torch modules over blockdraft's own layers.

TargetGraph: input_ids, position_ids [b, t] + past K/V per layer -> logits [b, t, V], the
drafter's packed taps [b, t, F] (`hidden_states`, auxiliary output) and present K/V
(past ‖ new; the host keeps the committed prefix).

DrafterGraph: the new committed context rows' raw taps [b, t, F] with their positions, the
block ids [b, B] (anchor, mask, ...) + past drafter K/V -> the candidate lattice
(`draft_candidate_ids` int64 [b, n, K], `draft_scores` fp32 [b, n, K, K]) and present K/V.
The block sits right after the new rows (its anchor position = last new position + 1) and
attends to [past ‖ new context ‖ block] ("dual source", non-causal within the block unless
the layer is sliding/causal). A sliding-window layer's present keeps its last `window` rows.
Past rows are contiguous positions ending just before the new rows.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import Taps
from ..cache.views import causal_visibility
from ..models.drafter import BlockDrafter
from ..cache.views import ContextRead
from ..models.target import TargetModel
from ..spec_decode.lattice import block_lattice


def _past_positions(position_ids: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
    """[b, t], past [b, h, P, d] -> positions [b, P] of the P rows just before position_ids[:, 0]."""
    p = past.shape[2]
    return position_ids[:, :1] - p + torch.arange(p, device=position_ids.device)[None, :]


class _ConcatStep:
    """A target step over explicit past K/V: kv() returns past ‖ new and records the presents."""

    def __init__(self, position_ids: torch.Tensor, past: list[torch.Tensor]):
        self.positions, self.past, self.presents = position_ids, past, []
        k_pos = torch.cat([_past_positions(position_ids, past[0]), position_ids], dim=1)
        self.visible = causal_visibility(position_ids, k_pos)

    def kv(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        k = torch.cat([self.past[2 * layer], k], dim=2)
        v = torch.cat([self.past[2 * layer + 1], v], dim=2)
        self.presents += [k, v]
        return k, v


class TargetGraph(nn.Module):
    def __init__(self, target: TargetModel, taps: Taps):
        super().__init__()
        self.target, self.tap_layers = target, taps

    def forward(self, input_ids, position_ids, *past):
        step = _ConcatStep(position_ids, list(past))
        out = self.target(input_ids, step, self.tap_layers)
        return (out.logits, out.taps, *step.presents)


class DrafterGraph(nn.Module):
    def __init__(self, drafter: BlockDrafter, top_k: int):
        super().__init__()
        self.drafter, self.top_k = drafter, top_k
        # registered so the exporter emits them as named initializers, which share_initializers then
        # stores once for both graphs (they are the target's own tensors)
        self.shared_embed_tokens, self.shared_lm_head = drafter.shared.embed_tokens, drafter.shared.lm_head
        self.windows = [layer.window for layer in drafter.layers]

    def forward(self, hidden_states, position_ids, input_ids, *past):
        d = self.drafter
        ctx = d.hidden_norm(d.fc(hidden_states.to(d.dtype)))                            # [b, t, D]
        cos, sin = d.rotary.cos_sin(position_ids, d.dtype)
        keys, values, positions, presents = [], [], [], []
        for i, layer in enumerate(d.layers):
            k, v = layer.self_attn.context_kv(ctx, cos, sin)
            past_k, past_v = past[2 * i], past[2 * i + 1]
            positions.append(torch.cat([_past_positions(position_ids, past_k), position_ids], dim=1))
            keys.append(torch.cat([past_k, k], dim=2))
            values.append(torch.cat([past_v, v], dim=2))
            window = self.windows[i]
            presents += [keys[-1][:, :, -window:], values[-1][:, :, -window:]] if window else [keys[-1], values[-1]]
        read = ContextRead(keys, values, positions, [None] * len(keys), position_ids[:, -1] + 1)
        hidden = d.block_hidden_of(input_ids, read)                                      # [b, B, D]
        lattice = block_lattice(d, hidden, input_ids[:, 0], self.top_k)
        return (lattice.candidate_ids, lattice.scores, *presents)
