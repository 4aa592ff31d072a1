"""Block drafter: the DFlash backbone every kind shares, with the heads its kind adds (`drafters/`).

The backbone projects the target's taps into a context (`hidden_norm(fc(taps))`)
whose K/V live in the drafter's own cache ("KV injection"); the block
`[anchor, mask, ...]` attends to `[context ‖ block]`. Which rows become drafts and
how tokens are chosen from the logits is `spec_decode/propose.py`'s business; this
module only turns (context, block) into hidden states and logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import DrafterConfig
from ..drafters.registry import drafter_kind
from ..errors import ConfigError
from ..cache.views import causal_visibility
from ..layers.attention import attend
from ..layers.linear import StableLinear
from ..layers.norm import RMSNorm, rms_normalized
from ..layers.rope import Rotary, apply_rope
from .kv_cache import KVCache
from ..layers.mlp import MLP
from .target import TargetModel


class InjectedAttention(nn.Module):
    """Block queries over [context K/V from the cache ‖ block K/V]; Qwen3 q/k norms, RoPE by position.
    Gemma blocks (`v_norm`): a gain-less norm on V, scale 1.0; V = the raw K projection where `attention_k_eq_v`."""

    def __init__(self, cfg: DrafterConfig, layer: int, v_norm: bool = False):
        super().__init__()
        if cfg.num_heads % cfg.num_kv_heads:
            raise ConfigError(f"drafter layer {layer}: num_attention_heads={cfg.num_heads} is not divisible by "
                             f"num_key_value_heads={cfg.num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = StableLinear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=bias)
        self.k_proj = StableLinear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = (None if cfg.attention_k_eq_v
                       else StableLinear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias))
        self.o_proj = StableLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.v_norm_eps = cfg.rms_norm_eps if v_norm else None
        self.scale = 1.0 if v_norm else cfg.head_dim ** -0.5

    def _heads(self, x: torch.Tensor, proj: nn.Linear, n: int) -> torch.Tensor:
        b, t, _ = x.shape
        return proj(x).view(b, t, n, self.head_dim)

    def context_kv(self, ctx: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected context rows [b, n, D] -> K, V [b, hkv, n, d] (k_norm, then RoPE; no input norm)."""
        raw = self._heads(ctx, self.k_proj, self.num_kv_heads)
        k = apply_rope(self.k_norm(raw).transpose(1, 2), cos, sin)
        v = raw if self.v_proj is None else self._heads(ctx, self.v_proj, self.num_kv_heads)
        if self.v_norm_eps is not None:
            v = rms_normalized(v, self.v_norm_eps).to(v.dtype)
        return k, v.transpose(1, 2)

    def queries(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        """Block rows [b, t, D] -> Q [b, h, t, d] (q_norm, then RoPE)."""
        return apply_rope(self.q_norm(self._heads(x, self.q_proj, self.num_heads)).transpose(1, 2), cos, sin)

    def forward(self, x, cos, sin, ctx_k, ctx_v, visible) -> torch.Tensor:
        k, v = self.context_kv(x, cos, sin)
        q = self.queries(x, cos, sin)
        if shared_context(ctx_k, q):
            return self.o_proj(attend_shared_context(q, ctx_k[:1], ctx_v[:1], k, v, visible, self.scale))
        k, v = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)
        return self.o_proj(attend(q, k, v, visible, self.scale))


def shared_context(ctx_k: torch.Tensor, q: torch.Tensor) -> bool:
    """Training on many blocks of one sequence on the CPU: every block reads the same context rows (one
    K/V expanded over the blocks, `train/losses.context_read`) and gradients are recorded. CUDA keeps the
    fused kernel: the shared-context form was measured (1.23x blocks/s) and tested on the CPU only."""
    return (torch.is_grad_enabled() and q.requires_grad and ctx_k.shape[0] > 1 and ctx_k.stride(0) == 0
            and ctx_k.device.type == "cpu")


def attend_shared_context(q: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, visible: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(q [ctx_k ‖ k]^T · scale) [ctx_v ‖ v] for training, in fp32, with the context's K/V read once
    for all blocks instead of copied per block (what the fused kernel does with an expanded K and, in its
    backward, with the expanded gradient). q [M, h, t, d]; ctx_k/ctx_v [1, hkv, C, d]; k/v [M, hkv, t, d]
    (each block's own rows); visible [M, 1, t, C + t] or None -> [M, t, h*d]."""
    m, h, t, d = q.shape
    hkv, c = ctx_k.shape[1], ctx_k.shape[2]
    with torch.autocast(q.device.type, enabled=False):
        qg = q.float().view(m, hkv, h // hkv, t, d)                                     # [M, hkv, g, t, d]
        scores = torch.cat([torch.einsum("mkgtd,kcd->mkgtc", qg, ctx_k[0].float()),
                            torch.einsum("mkgtd,mksd->mkgts", qg, k.float())], dim=-1) * scale
        if visible is not None:                                                       # [M, hkv, g, t, C + t]
            scores = scores.masked_fill(~visible[:, :, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = (torch.einsum("mkgtc,kcd->mkgtd", probs[..., :c], ctx_v[0].float())
               + torch.einsum("mkgts,mksd->mkgtd", probs[..., c:], v.float()))
    return out.to(q.dtype).reshape(m, h, t, d).transpose(1, 2).reshape(m, t, h * d)


class DrafterLayer(nn.Module):
    """The Qwen3-style pre-norm layer of the published DFlash, DFlash2 and DSpark drafters, with the mixers
    its kind wraps around attention and MLP (DFlash2's grouped causal convs)."""

    def __init__(self, cfg: DrafterConfig, layer: int, act: str = "silu", v_norm: bool = False):
        super().__init__()
        self.self_attn = InjectedAttention(cfg, layer, v_norm)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, act=act)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.causal, self.window = cfg.layer_is_causal(layer), cfg.layer_window(layer)
        # mixers the kind wraps around attention and MLP (DFlash2's grouped causal convs), else None
        self.attention_conv, self.mlp_conv = drafter_kind(cfg.kind).layer_mixers(cfg)

    def visibility(self, q_pos: torch.Tensor, k_pos: torch.Tensor, k_valid: torch.Tensor | None
                   ) -> torch.Tensor | None:
        """[b, 1, rows, keys] or None (everything visible). k_valid marks real keys in ragged batches."""
        visible = None if k_valid is None else k_valid[:, None, None, :]
        if self.causal or self.window is not None:
            rule = causal_visibility(q_pos, k_pos, self.window, self.causal)
            visible = rule if visible is None else visible & rule
        return visible

    def forward(self, x, attention):
        """x [b, rows, D]; `attention(self_attn, h)` runs this layer's attention for the normed rows h
        over whatever context the caller holds (a `ContextRead`, or an exported graph's pages)."""
        h = self.input_layernorm(x)
        if self.attention_conv is not None:
            h, kernel = self.attention_conv.prepare(h)
        h = attention(self.self_attn, h)
        if self.attention_conv is not None:
            h = self.attention_conv.finish(h, kernel)
        x = x + h
        h = self.post_attention_layernorm(x)
        if self.mlp_conv is not None:
            h, kernel = self.mlp_conv.prepare(h)
        h = self.mlp(h)
        if self.mlp_conv is not None:
            h = self.mlp_conv.finish(h, kernel)
        return x + h


class GemmaDrafterLayer(DrafterLayer):
    """DeepSpec's Gemma 4 DSpark backbone (`gemma_blocks`): the attention and MLP outputs normed before their
    residual adds (post_attention / pre- and post_feedforward norms), a GeGLU MLP, V normed without a gain,
    attention scale 1.0, and the layer's output scaled by its `layer_scalar`."""

    def __init__(self, cfg: DrafterConfig, layer: int):
        super().__init__(cfg, layer, act="gelu_tanh", v_norm=True)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, x, attention):
        x = x + self.post_attention_layernorm(attention(self.self_attn, self.input_layernorm(x)))
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x * self.layer_scalar


@dataclass
class SharedWeights:
    """The target's embedding and LM head, reused by reference (not registered, not saved), and the
    soft cap the target puts on its logits (Gemma), which its distribution includes."""

    embed_tokens: nn.Embedding
    lm_head: nn.Linear
    logit_softcap: float | None = None


class BlockDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, target: TargetModel):
        super().__init__()
        self.config = cfg
        tcfg = target.config
        self.fc = StableLinear(len(cfg.target_layer_ids) * tcfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        backbone = GemmaDrafterLayer if cfg.gemma_blocks else DrafterLayer
        self.layers = nn.ModuleList(backbone(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.rope, cfg.head_dim)
        self.shared = SharedWeights(target.embed_tokens, target.lm_head, tcfg.final_logit_softcapping)
        if cfg.own_embed_tokens:
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        if cfg.own_lm_head:
            self.lm_head = StableLinear(cfg.hidden_size, cfg.output_vocab_size, bias=False)
        if cfg.pruned_vocab:  # speculators / EAGLE-3: target id = draft id + d2t[draft id]; t2d marks kept ids
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        drafter_kind(cfg.kind).add_heads(self, cfg)       # DSpark's Markov/confidence heads, DFlash2's selector

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype          # (not fc's: a weight-only fc stores no activation dtype)

    def new_cache(self, batch: int = 1, capacity: int = 256) -> KVCache:
        c = self.config
        return KVCache(c.num_layers, batch, c.num_kv_heads, c.head_dim, self.dtype, self.norm.weight.device, capacity)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.config.own_embed_tokens:
            x = self.embed_tokens(ids)
            if self.config.gemma_blocks:                 # √H, rounded to the weights' dtype as Gemma does
                x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)
            return x
        return self.shared.embed_tokens(ids) * self.config.input_embedding_scale

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (identity without a pruned vocabulary)."""
        return draft_ids + self.d2t[draft_ids] if self.config.pruned_vocab else draft_ids

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft-vocabulary ids, -1 where the draft vocabulary lacks the token."""
        if not self.config.pruned_vocab:
            return target_ids
        index = torch.cumsum(self.t2d.long(), 0) - 1                                      # [V]
        return torch.where(self.t2d[target_ids], index[target_ids], torch.full_like(target_ids, -1))

    def to_target_vocab(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """[.., draft vocab] -> [.., vocab]: each draft column at its target id, `fill` elsewhere."""
        if not self.config.pruned_vocab:
            return values
        out = values.new_full((*values.shape[:-1], self.config.vocab_size), fill)
        return out.index_copy_(-1, self.to_target(torch.arange(values.shape[-1], device=values.device)), values)

    def check_vocab_map(self, what: str) -> None:
        """d2t and t2d must describe the same `draft_vocab_size` target ids (named error if not)."""
        if not self.config.pruned_vocab:
            return
        n, kept = self.config.draft_vocab_size, int(self.t2d.sum())
        if kept != n:
            raise ConfigError(f"{what}: t2d marks {kept} target ids but draft_vocab_size={n}")
        ids = self.to_target(torch.arange(n, device=self.d2t.device))
        if bool((ids < 0).any() | (ids >= self.config.vocab_size).any()):
            raise ConfigError(f"{what}: d2t maps draft ids outside the target vocabulary [0, {self.config.vocab_size})")
        expected = torch.nonzero(self.t2d)[:, 0]
        if not torch.equal(ids, expected):
            bad = int(torch.nonzero(ids != expected)[0, 0])
            raise ConfigError(f"{what}: d2t and t2d disagree at draft id {bad} (d2t -> {int(ids[bad])}, "
                              f"t2d's {bad}-th kept id is {int(expected[bad])})")

    def logits(self, hidden: torch.Tensor, shard: bool = False) -> torch.Tensor:
        """Draft logits [.., output vocab]: LM head × output_multiplier, then soft-capping if configured.
        Columns are draft-vocabulary ids when the vocabulary is pruned (`to_target` maps them).
        `shard`: only this rank's vocabulary slice (a tensor-parallel head)."""
        head = self.lm_head if self.config.own_lm_head else self.shared.lm_head
        if isinstance(head, nn.Linear) and head.weight.dtype != hidden.dtype:   # fp32 training over a bf16 target
            hidden = hidden.to(head.weight.dtype)
        logits = head.local(hidden) if shard else head(hidden)
        if self.config.output_multiplier != 1.0:                # (x * 1.0 is x: no full-vocabulary pass for it)
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def extend_context(self, taps: torch.Tensor, cache) -> None:
        """Commit context rows: taps [b, n, taps*H] of committed tokens. `cache` is a KVCache
        (rows go at cache.length..) or a paged step view whose positions/slots say where."""
        b, n, _ = taps.shape
        if n == 0:
            return
        step = cache.begin(n) if isinstance(cache, KVCache) else cache
        ctx = self.hidden_norm(self.fc(taps.to(self.dtype)))
        cos, sin = self.rotary.cos_sin(step.positions, self.dtype)
        for i, layer in enumerate(self.layers):
            step.kv(i, *layer.self_attn.context_kv(ctx, cos, sin))
        if isinstance(cache, KVCache):
            cache.truncate(step.end)

    def block_hidden(self, anchor: torch.Tensor, rows: int, cache,
                     block_valid: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden [b, rows, D] of the block [anchor, mask × (rows-1)] at each row's anchor position.

        `cache` is a KVCache or a `ContextRead` (ragged batches); `block_valid` [b, rows] masks block
        rows a shorter block does not have (its keys must not be seen by the other slots).
        """
        ids = torch.full((anchor.shape[0], rows), self.config.mask_token_id, dtype=torch.long, device=anchor.device)
        ids[:, 0] = anchor
        return self.block_hidden_of(ids, cache.context() if isinstance(cache, KVCache) else cache, block_valid)

    def block_hidden_of(self, ids: torch.Tensor, ctx, block_valid: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden [b, rows, D] of block token ids [b, rows] over a `ContextRead`."""
        x = self.embed(ids).to(self.dtype)
        q_pos = ctx.start[:, None] + torch.arange(ids.shape[1], device=ids.device)            # [b, rows]
        bv = torch.ones_like(q_pos, dtype=torch.bool) if block_valid is None else block_valid
        cos, sin = self.rotary.cos_sin(q_pos, x.dtype)
        for i, layer in enumerate(self.layers):
            k_pos = torch.cat([ctx.positions[i], q_pos], dim=1)
            valid = ctx.valid[i]
            all_valid = block_valid is None and bool(valid.all())
            k_valid = None if all_valid else torch.cat([valid, bv], dim=1)
            visible = layer.visibility(q_pos, k_pos, k_valid)
            x = layer(x, lambda attn, h: attn(h, cos, sin, ctx.keys[i], ctx.values[i], visible))
        return self.norm(x)
