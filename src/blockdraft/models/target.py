"""Llama / Qwen3 / Qwen3.5 decoder that returns logits and, in the same pass, the drafter's taps.

Qwen3 differs from Llama only by q/k RMSNorm per head (`qk_norm`); everything else
(GQA, tied embeddings, RoPE scaling) is config. Qwen3.5's hybrid layers (Gated DeltaNet with
per-sequence state, gated attention) live in `qwen3_5.py`, LFM2's short-conv layers in `lfm2.py`, the
MoE feed-forward of either in `layers/moe.py`;
a step view's `state` carries their per-sequence state. A tap of layer i is the residual stream
after layer i; for the last layer its value depends on the drafter's tap point
(`Taps.point`): "hidden_states" (HF `hidden_states[-1]`) is after the final norm,
"layer_output" (DeepSpec DSpark) before it.
This module knows nothing about drafting or sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..cache.state import StatePool
from ..config import Taps, TargetConfig
from ..layers import cpu_kernels as kernels
from ..layers.attention import attend
from ..layers.direct import DirectCall
from ..layers.linear import StableLinear
from ..layers.moe import feed_forward
from ..layers.norm import RMSNorm
from ..layers.rope import Rotary, apply_rope
from .kv_cache import KVCache
from .gemma4 import Gemma4Layer, PerLayerEmbeddings, TypedRotary
from .lfm2 import ShortConvLayer
from .qwen3_5 import HybridDecoderLayer, OffsetRMSNorm


class TargetAttention(DirectCall):
    """Full-attention layers read and write the step's KV; sliding-window layers (gpt-oss) keep their
    last `sliding_window - 1` K/V rows as per-sequence state (`cache/state.py`) and attend over those and
    the step's own rows. `sinks`: a learned per-head logit in every softmax (gpt-oss)."""

    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.window = cfg.sliding_window if cfg.layer_type(layer) == "sliding_attention" else None
        self.sinks = nn.Parameter(torch.zeros(cfg.num_heads)) if cfg.attention_sinks else None
        self.q_proj = StableLinear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.k_proj = StableLinear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.v_proj = StableLinear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.o_proj = StableLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.attention_bias)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.qkv_proj = None          # q, k, v in one matmul when `layers/quant.py` fuses them

    def _rotated(self, x, cos, sin):
        """q [b, h, t, d], k and v [b, hkv, t, d], q and k rotated."""
        b, t, _ = x.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_proj is not None and not self.qk_norm:   # fused: q and k rotate in one pass (same bits)
            heads = self.qkv_proj(x).view(b, t, h + 2 * hkv, d).transpose(1, 2)
            qk = apply_rope(heads[:, :h + hkv], cos, sin)
            return qk[:, :h], qk[:, h:], heads[:, h + hkv:]
        if self.qkv_proj is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            q, k, v = self.qkv_proj(x).split([h * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.reshape(b, t, h, d), k.reshape(b, t, hkv, d), v.reshape(b, t, hkv, d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def forward(self, x, cos, sin, step, layer: int):
        q, k, v = self._rotated(x, cos, sin)
        if self.window is None:
            k, v = step.kv(layer, k, v)
            visible = step.visible
        else:
            k, v, visible = step.state.sliding_kv(layer, k, v, step.positions, self.window)
        return self.o_proj(attend(q, k, v, visible, self.head_dim ** -0.5, self.sinks))


class DecoderLayer(DirectCall):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        self.self_attn = TargetAttention(cfg, layer)
        self.mlp = feed_forward(cfg, layer)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, step, layer):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, step, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class TargetOutput:
    logits: torch.Tensor              # [batch, rows, vocab] (rows = all or the last `logits_rows`)
    taps: torch.Tensor | None = None  # [batch, seq, len(taps.layers) * hidden]
    hidden: torch.Tensor | None = None  # [batch, seq, hidden] after the final norm, every row


class TargetModel(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        if cfg.architecture.startswith("qwen3_5"):
            self.layers = nn.ModuleList(HybridDecoderLayer(cfg, i) for i in range(cfg.num_layers))
            self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        elif cfg.architecture == "gemma4":
            self.layers = nn.ModuleList(Gemma4Layer(cfg, i) for i in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            if cfg.per_layer_input_size:
                self.per_layer = PerLayerEmbeddings(cfg)
        elif cfg.architecture.startswith("lfm2"):
            self.layers = nn.ModuleList(
                ShortConvLayer(cfg, feed_forward(cfg, i)) if cfg.layer_type(i) == "short_conv"
                else DecoderLayer(cfg, i) for i in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        else:
            self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = StableLinear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = TypedRotary(cfg) if cfg.architecture == "gemma4" else Rotary(cfg.rope, cfg.rotary_dim)
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
        spec = tap_layers if isinstance(tap_layers, Taps) else Taps(tuple(tap_layers))
        tap_layers = spec.layers
        x = self.embed(input_ids, step)
        taps = {}
        last = len(self.layers) - 1
        kv = step.kernel_kv() if self.fused is not None and hasattr(step, "kernel_kv") else None
        if kv is not None:         # quantized on the CPU: every layer in one kernel call
            x, tapped = self.fused.run(x, cos, sin, kv, step.visible, list(tap_layers))
            taps = dict(zip(tap_layers, tapped))
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x, cos, sin, step, i)
                if i in tap_layers:
                    taps[i] = x
        x = self.norm(x)
        if last in tap_layers and spec.point == "hidden_states":
            taps[last] = x  # HF hidden_states[-1] is after the final norm
        hidden = x
        if logits_rows is not None:
            x = x[:, -logits_rows:]
        if logits_at is not None:
            x = x[torch.arange(b, device=x.device), logits_at][:, None]
        packed = torch.cat([taps[i] for i in tap_layers], dim=-1) if tap_layers else None
        logits = self.lm_head(x)
        cap = self.config.final_logit_softcapping
        if cap is not None:                                   # Gemma: cap · tanh(logits / cap)
            logits = torch.tanh(logits / cap) * cap
        return TargetOutput(logits, packed, hidden)

    def embed(self, input_ids: torch.Tensor, step) -> torch.Tensor:
        """The token embeddings the first layer reads [b, t, H]. Gemma 4 scales them by √H (rounded to
        the weights' dtype, as transformers does), hands the step its per-layer inputs, and gives the
        step a place for the K/V its shared layers reuse."""
        x = self.embed_tokens(input_ids)
        if self.config.architecture == "gemma4":
            x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)
            step.shared_kv = {}
            if self.config.per_layer_input_size:
                step.per_layer_inputs = self.per_layer(input_ids, x)
        return x

    @torch.inference_mode()
    def logits(self, input_ids) -> torch.Tensor:
        """Full-sequence logits [batch, seq, vocab], no cache. Accepts ids as a list or tensor."""
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device)
        return self.forward(ids[None] if ids.dim() == 1 else ids).logits
