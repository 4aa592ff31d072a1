"""The target shell: embeddings, a family's layers, final norm and LM head; logits and, in the same
pass, the drafter's taps.

The family (`registry.family_of(config.architecture)`, kept as `self.family`) builds the layers,
final norm and RoPE and may add an embedding step; the shell knows no family. A step view's `state`
carries the per-sequence state of stateful layers. A tap of layer i is the residual stream after
layer i; for the last layer its value depends on the drafter's tap point (`Taps.point`):
"hidden_states" (HF `hidden_states[-1]`) is after the final norm, "layer_output" (DeepSpec DSpark)
before it.
This module knows nothing about drafting or sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..cache.state import StatePool
from ..cache.views import RowKV
from ..config import Taps, TargetConfig
from ..layers import cpu_kernels as kernels
from ..layers.linear import StableLinear
from ..layers.rope import Rotary
from .family import unchanged_embeddings
from .kv_cache import KVCache
from .registry import family_of


@dataclass
class TargetOutput:
    logits: torch.Tensor              # [batch, rows, vocab] (rows = all or the last `logits_rows`)
    taps: torch.Tensor | None = None  # [batch, seq, len(taps.layers) * hidden]
    hidden: torch.Tensor | None = None  # [batch, seq, hidden] after the final norm, every row
    argmax: torch.Tensor | None = None  # [batch, rows] the logits' argmax, where the fused CPU step computed it


def _taps(tap_layers: Taps | tuple[int, ...]) -> Taps:
    """What the caller asked for as `Taps` (bare layer ids: read at the default point)."""
    return tap_layers if isinstance(tap_layers, Taps) else Taps(tuple(tap_layers))


class TargetModel(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.family = family_of(cfg.architecture)
        parts = self.family.decoder(cfg)
        self.layers = parts.layers
        self.norm = parts.norm
        for name, module in parts.extras.items():
            self.add_module(name, module)
        self.lm_head = StableLinear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = parts.rotary
        self.fused: kernels.LayerStack | None = None   # set by `layers/quant.py` where the CPU kernels take every layer

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def new_cache(self, batch: int = 1, capacity: int = 256) -> KVCache:
        """A contiguous cache for `batch` streams; with the per-sequence state of a target's DeltaNet,
        short-conv and sliding-window layers (batch row i = state slot i)."""
        c = self.config
        states = None
        if c.hybrid:
            states = StatePool(c.state_layout, batch, self.dtype, self.device)
            for _ in range(batch):
                states.acquire()
        return KVCache(c.num_layers, batch, c.num_kv_heads, c.head_dim, self.dtype, self.device, capacity, states,
                       [c.kv_geometry(i) for i in range(c.num_layers)])

    def forward(self, input_ids: torch.Tensor, cache=None, tap_layers: Taps | tuple[int, ...] = (),
                logits_rows: int | None = None, logits_at: torch.Tensor | None = None) -> TargetOutput:
        """input_ids [batch, seq]. `cache` is a KVCache (rows go at cache.length..) or a step
        view from a paged batch (positions and slots given); None = a fresh causal pass.

        Writes K/V for every row but commits nothing: the caller keeps what it accepts
        (`cache.truncate(n)`, or the block manager's lengths).
        """
        b, t = input_ids.shape
        step = cache.begin(t) if isinstance(cache, KVCache) else cache
        if step is None:
            step = self.new_cache(b, t).begin(t)
        cos, sin = self.rotary.cos_sin(step.positions, self.dtype)
        spec = _taps(tap_layers)
        tap_layers = spec.layers
        x = self.embed(input_ids, step)
        taps = {}
        last = len(self.layers) - 1
        kv = step.kernel_kv() if self.fused is not None and hasattr(step, "kernel_kv") else None
        logits = picked = normed = None
        if kv is not None:         # quantized on the CPU: every layer in one kernel call
            head = self.fused.head   # and the final norm and LM head, where every row's logits are wanted
            every_row = logits_rows is None and logits_at is None and head is not None and head.serves(self.norm,
                                                                                                         self.lm_head)
            run = self.fused.run(x, cos, sin, kv, kv.visible, list(tap_layers), head=head if every_row else None)
            x, taps = run.hidden, dict(zip(tap_layers, run.taps))
            normed, logits, picked = run.normed, run.logits, run.argmax
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x, cos, sin, step, i)
                if i in tap_layers:
                    taps[i] = x
        x = self.norm(x) if normed is None else normed
        if last in tap_layers and spec.point == "hidden_states":
            taps[last] = x  # HF hidden_states[-1] is after the final norm
        hidden = x
        if logits_rows is not None:
            x = x[:, -logits_rows:]
        if logits_at is not None:
            x = x[torch.arange(b, device=x.device), logits_at][:, None]
        packed = torch.cat([taps[i] for i in tap_layers], dim=-1) if tap_layers else None
        if logits is None:
            logits = self.lm_head(x)
        cap = self.config.final_logit_softcapping
        if cap is not None:                                   # Gemma: cap · tanh(logits / cap)
            logits = torch.tanh(logits / cap) * cap
        return TargetOutput(logits, packed, hidden, picked)

    def fused_row(self, token: int, position: int, kv: RowKV, tap_layers: Taps | tuple[int, ...] = ()
                  ) -> TargetOutput | None:
        """One decoding row, `token` at `position`, as `forward` computes it with every row's logits, in one
        `LayerStack.run_row` call from addresses: the embedding's row, the rotary table's row and `kv`'s slots,
        no tensor made for them. None where that call does not take this model (no fused layers or head, an
        embedding step or rotary that is not plain). The logits, hidden and argmax are overwritten by the next
        call."""
        fused = self.fused
        if (fused is None or fused.head is None or not fused.head.serves(self.norm, self.lm_head)
                or self.family.embed is not unchanged_embeddings):
            return None
        table = self.rotary.table(position + 1, self.dtype) if isinstance(self.rotary, Rotary) else None
        weight = self.embed_tokens.weight
        if table is None or not weight.is_contiguous():
            return None
        if not 0 <= token < weight.shape[0]:
            raise ValueError(f"token id {token}: the embedding has ids 0..{weight.shape[0] - 1}")
        spec = _taps(tap_layers)
        row, at = weight.shape[1] * weight.element_size(), position * table[0].shape[1] * table[0].element_size()
        run = fused.run_row(weight.data_ptr() + token * row, table[0].data_ptr() + at, table[1].data_ptr() + at, kv,
                            list(spec.layers))
        last = len(self.layers) - 1
        if last in spec.layers and spec.point == "hidden_states":   # HF hidden_states[-1] is after the final norm
            for i in (i for i, layer in enumerate(spec.layers) if layer == last):
                run.packed[..., i * weight.shape[1]:(i + 1) * weight.shape[1]] = run.normed
        return TargetOutput(run.logits, run.packed, run.normed, run.argmax)

    def embed(self, input_ids: torch.Tensor, step) -> torch.Tensor:
        """What the first layer reads [b, t, H]: the token embeddings as the family's `embed` step
        leaves them (it may scale them and hand the step more inputs)."""
        return self.family.embed(self, input_ids, self.embed_tokens(input_ids), step)

    @torch.inference_mode()
    def logits(self, input_ids) -> torch.Tensor:
        """Full-sequence logits [batch, seq, vocab], no cache. Accepts ids as a list or tensor."""
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device)
        return self.forward(ids[None] if ids.dim() == 1 else ids).logits
