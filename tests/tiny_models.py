"""In-memory random models: with a very small vocabulary (for distribution tests), and a quantized one whose
decoding rows take the fused CPU step's address pass."""

from functools import lru_cache

import torch

from blockdraft.config import DrafterConfig, TargetConfig
from blockdraft.drafters.dflash2 import DFlash2Heads
from blockdraft.drafters.dspark import DSparkHeads
from blockdraft.models.drafter import BlockDrafter
from blockdraft.models.target import TargetModel

VOCAB = 8


def row_pass_target(scheme: str = "int4") -> TargetModel:
    """A random Qwen3 target (the tiny fixture's shape, heads 32 wide so that they take the rotary table),
    quantized: a lone decoding row runs `TargetModel.fused_row` where the CPU kernels build."""
    import dataclasses

    from blockdraft.layers.quant import quantize_target
    from blockdraft.loading import load_target
    from conftest import ASSETS
    cfg = load_target(ASSETS / "target-qwen3", "bfloat16", "none").config
    torch.manual_seed(4)
    model = TargetModel(dataclasses.replace(cfg, head_dim=32)).to(torch.bfloat16).eval().requires_grad_(False)
    return quantize_target(model, scheme)


@lru_cache(maxsize=None)
def tiny_pair(kind: str) -> tuple[TargetModel, BlockDrafter]:
    torch.manual_seed(42)
    tcfg = TargetConfig(architecture="qwen3", vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_layers=2,
                        num_heads=2, num_kv_heads=1, head_dim=16, qk_norm=True, max_position_embeddings=64)
    target = TargetModel(tcfg)
    extra = {}
    if kind == "dspark":
        extra = dict(heads=DSparkHeads(markov_rank=4, enable_confidence_head=True))
    if kind == "dflash2":
        extra = dict(heads=DFlash2Heads(conv_kernel_size=2, conv_group_size=8, selector_top_k=4, selector_rank=4))
    dcfg = DrafterConfig(kind=kind, vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16, target_layer_ids=(0, 1), mask_token_id=VOCAB - 1,
                         block_size=3 if kind != "dspark" else 2, shift_label=kind == "dspark",
                         layer_types=("full_attention",), **extra)
    drafter = BlockDrafter(dcfg, target)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "base_kernel" in name:
                p.normal_(0, 0.1)
    return target.eval().requires_grad_(False), drafter.eval().requires_grad_(False)


@lru_cache(maxsize=None)
def tiny_hybrid_pair(kind: str) -> tuple[TargetModel, BlockDrafter]:
    """A random Qwen3.5 target (DeltaNet, DeltaNet, gated attention) over the 8-token vocabulary and a
    random drafter tapping a DeltaNet and the attention layer."""
    from blockdraft.config import DeltaNetConfig
    torch.manual_seed(7)
    tcfg = TargetConfig(architecture="qwen3_5", vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_layers=3,
                        num_heads=2, num_kv_heads=1, head_dim=16, qk_norm=True, max_position_embeddings=64,
                        layer_types=("linear_attention", "linear_attention", "full_attention"),
                        deltanet=DeltaNetConfig(num_k_heads=1, num_v_heads=2, k_dim=8, v_dim=8, conv_kernel=4),
                        partial_rotary_factor=0.5, attn_output_gate=True, norm_offset=True)
    target = TargetModel(tcfg)
    with torch.no_grad():
        for p in target.parameters():
            p.normal_(0.0, 0.3)
    extra = dict(heads=DSparkHeads(markov_rank=4, enable_confidence_head=True)) if kind == "dspark" else {}
    dcfg = DrafterConfig(kind=kind, vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16, target_layer_ids=(0, 2), mask_token_id=VOCAB - 1,
                         block_size=3 if kind != "dspark" else 2, shift_label=kind == "dspark",
                         layer_types=("full_attention",), **extra)
    drafter = BlockDrafter(dcfg, target)
    return target.eval().requires_grad_(False), drafter.eval().requires_grad_(False)
