"""Shard a loaded target and drafter across a tensor-parallel group, in place.

Attention: q/k/v column-parallel by whole heads (KV heads split across ranks, each rank
keeping the query heads of its KV groups), o_proj row-parallel. MLP: gate/up column,
down row. Embedding and LM head vocab-parallel (the drafter's shared ones are the
target's sharded modules). DSpark: `markov_w1` replicated, `markov_w2` split by vocabulary
(`drafters.dspark.ShardedMarkovHead`). Norms, the drafter's fc, DFlash2 convs and selector are replicated.
After the row-parallel all-reduce every rank holds the full residual stream, so the taps
the drafter reads are complete on every rank without a further gather.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..config import DrafterConfig, TargetConfig
from ..errors import ConfigError
from ..drafters.registry import drafter_kind
from ..models.drafter import BlockDrafter
from ..models.registry import family_of
from ..models.target import TargetModel
from .layers import (ColumnParallelLinear, RowParallelLinear, TPGroup, VocabParallelEmbedding,
                     VocabParallelHead)


def check_tp(tp: int, target: TargetConfig | None, drafter: DrafterConfig | None = None) -> None:
    """Refuse a TP size the models cannot be split by — before any process starts (and again before
    any weight is sliced, so a head is never silently dropped)."""
    if not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"--tp must be an integer >= 1, got {tp!r}")
    if tp > 1 and target is not None and not family_of(target.architecture).capabilities.tensor_parallel:
        raise ConfigError(f"--tp {tp}: {target.architecture} targets are not sharded by blockdraft's tensor "
                          "parallelism (it splits Llama/Qwen3 decoders); run them with --tp 1")
    names = {"num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
             "intermediate_size": "intermediate_size", "vocab_size": "vocab_size"}
    for who, cfg in (("target", target), ("drafter", drafter)):
        if cfg is None:
            continue
        for field, name in names.items():
            value = getattr(cfg, field)
            if value % tp:
                raise ConfigError(f"--tp {tp}: {who} {name}={value} is not divisible by the TP size {tp}")


def _shard_attention(attn: nn.Module, tp: TPGroup) -> None:
    d = attn.head_dim
    q_lo, q_hi = tp.split(attn.num_heads)
    kv_lo, kv_hi = tp.split(attn.num_kv_heads)
    attn.q_proj = ColumnParallelLinear(attn.q_proj, q_lo * d, q_hi * d)
    attn.k_proj = ColumnParallelLinear(attn.k_proj, kv_lo * d, kv_hi * d)
    attn.v_proj = ColumnParallelLinear(attn.v_proj, kv_lo * d, kv_hi * d)
    attn.o_proj = RowParallelLinear(attn.o_proj, q_lo * d, q_hi * d, tp)
    attn.num_heads, attn.num_kv_heads = q_hi - q_lo, kv_hi - kv_lo


def _shard_mlp(mlp: nn.Module, tp: TPGroup) -> None:
    lo, hi = tp.split(mlp.gate_proj.weight.shape[0])
    mlp.gate_proj = ColumnParallelLinear(mlp.gate_proj, lo, hi)
    mlp.up_proj = ColumnParallelLinear(mlp.up_proj, lo, hi)
    mlp.down_proj = RowParallelLinear(mlp.down_proj, lo, hi, tp)


def _local_config(cfg, tp: TPGroup):
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // tp.world, num_kv_heads=cfg.num_kv_heads // tp.world)


def shard_models(target: TargetModel, drafters, tp: TPGroup) -> None:
    """Shard a target and the drafters loaded against it (no-op at TP=1); drafters after the target."""
    if tp.world == 1:
        return
    shard_target(target, tp)
    for drafter in drafters:
        shard_drafter(drafter, target, tp)


@torch.no_grad()
def shard_target(target: TargetModel, tp: TPGroup) -> TargetModel:
    check_tp(tp.world, target.config)
    for layer in target.layers:
        _shard_attention(layer.self_attn, tp)
        _shard_mlp(layer.mlp, tp)
    target.embed_tokens = VocabParallelEmbedding(target.embed_tokens, tp)
    target.lm_head = VocabParallelHead(target.lm_head, tp)
    target.config = _local_config(target.config, tp)
    return target


@torch.no_grad()
def shard_drafter(drafter: BlockDrafter, target: TargetModel, tp: TPGroup) -> BlockDrafter:
    """Call after `shard_target`: the drafter's shared embedding / LM head become the target's shards."""
    check_tp(tp.world, None, drafter.config)
    for layer in drafter.layers:
        _shard_attention(layer.self_attn, tp)
        _shard_mlp(layer.mlp, tp)
    drafter.shared.embed_tokens, drafter.shared.lm_head = target.embed_tokens, target.lm_head
    if drafter.config.own_embed_tokens:
        drafter.embed_tokens = VocabParallelEmbedding(drafter.embed_tokens, tp)
    if drafter.config.own_lm_head:
        drafter.lm_head = VocabParallelHead(drafter.lm_head, tp)
    kind = drafter_kind(drafter.config.kind)
    if kind.shard is not None:                   # heads that score the vocabulary are split by it too
        kind.shard(drafter, tp)
    drafter.config = _local_config(drafter.config, tp)
    return drafter
