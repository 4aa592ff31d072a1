"""Write drafters in the layouts others publish: z-lab DFlash/DFlash2 and DeepSeek DSpark.

`new_drafter` builds a freshly initialised drafter shaped like its target (the target's
embedding and LM head are reused, not copied); `save_drafter` writes config.json and bf16
`model.safetensors` under the published names, which `load_drafter` (and the reference
packages) read back.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..config import DrafterConfig
from ..drafters import registry as kinds
from ..errors import ConfigError
from .rope_layout import reorder_rotated
from ..models.drafter import BlockDrafter
from ..models.registry import drafter_model_type
from ..models.target import TargetModel


def new_drafter(target: TargetModel, kind: str, num_layers: int, block_size: int,
                target_layer_ids: tuple[int, ...], mask_token_id: int, markov_rank: int = 64,
                seed: int = 0, draft_vocab: torch.Tensor | None = None, intermediate_size: int | None = None,
                **extra) -> BlockDrafter:
    """`draft_vocab` (sorted target ids) prunes the drafter's vocabulary: it gets its own LM head,
    initialised from the target's rows for those ids, and the d2t/t2d maps. `intermediate_size` widens or
    narrows the drafter's MLPs (default: the target's)."""
    t = target.config
    spec = kinds.drafter_kind(kind)
    extra.setdefault("tap_point", spec.tap_point)
    extra.setdefault("heads", spec.fresh(markov_rank))
    if draft_vocab is not None:
        draft_vocab = torch.as_tensor(draft_vocab, dtype=torch.long)
        if not bool((draft_vocab[1:] > draft_vocab[:-1]).all()):
            raise ValueError("draft_vocab must be strictly increasing target ids")
        extra.update(draft_vocab_size=len(draft_vocab), own_lm_head=True)
    cfg = DrafterConfig(kind=kind, vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                        intermediate_size=intermediate_size or t.intermediate_size, num_layers=num_layers, num_heads=t.num_heads,
                        num_kv_heads=t.num_kv_heads, head_dim=t.head_dim, target_layer_ids=tuple(target_layer_ids),
                        mask_token_id=mask_token_id, block_size=block_size, shift_label=spec.shift_label,
                        rms_norm_eps=t.rms_norm_eps, rope=t.rope, layer_types=("full_attention",) * num_layers,
                        **extra)
    drafter = BlockDrafter(cfg, target).to(target.dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        if draft_vocab is not None:
            drafter.d2t.copy_(draft_vocab - torch.arange(len(draft_vocab)))
            drafter.t2d.zero_()[draft_vocab] = True
            drafter.lm_head.weight.copy_(target.lm_head.weight.detach()[draft_vocab])
    return drafter.eval()


def published_config(cfg: DrafterConfig, target: TargetModel) -> dict:
    rope = {"rope_type": cfg.rope.rope_type, "rope_theta": cfg.rope.theta}
    if cfg.rope.rope_type != "default":
        rope.update(factor=cfg.rope.factor, original_max_position_embeddings=cfg.rope.original_max_position_embeddings)
    out = {"model_type": drafter_model_type(), "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
           "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
           "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
           "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope.theta, "rope_parameters": rope,
           "max_position_embeddings": target.config.max_position_embeddings, "hidden_act": "silu",
           "attention_bias": cfg.attention_bias, "tie_word_embeddings": False,
           "num_target_layers": target.config.num_layers, "block_size": cfg.block_size,
           "layer_types": list(cfg.layer_types), "torch_dtype": "bfloat16",
           "tap_point": cfg.tap_point}  # the value of each tapped layer it was trained on
    if cfg.pruned_vocab:  # speculators / EAGLE-3 spelling; d2t and t2d ride in model.safetensors
        out["draft_vocab_size"] = cfg.draft_vocab_size
    if cfg.sliding_window is not None:
        out.update(sliding_window=cfg.sliding_window, use_sliding_window=cfg.use_sliding_window)
    if cfg.rope_interleaved:
        out["rope_is_neox_style"] = False
    out.update(kinds.drafter_kind(cfg.kind).publish(cfg))    # the kind's keys and architectures
    return out


def save_drafter(drafter: BlockDrafter, target: TargetModel, out_dir: str | Path) -> Path:
    if drafter.config.gemma_blocks:
        raise ConfigError("saving a drafter with Gemma blocks (DeepSpec's Gemma4DSparkModel) is not supported: "
                          "the layouts written here are z-lab's and DeepSpec's Qwen3 ones")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    state = drafter.state_dict()
    if drafter.config.rope_interleaved:                  # back to the layout the drafter was trained in
        state = reorder_rotated(state, drafter.config.head_dim, inverse=True)
    suffixless = kinds.suffixless()
    for name, t in state.items():
        key = name[: -len(".weight")] if name[: -len(".weight")] in suffixless else name
        tensors[key] = (t.detach().to(torch.bfloat16) if t.is_floating_point() else t.detach()).contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(published_config(drafter.config, target), indent=2) + "\n")
    return out_dir


def prune_vocabulary(drafter: BlockDrafter, target: TargetModel, draft_vocab: torch.Tensor) -> BlockDrafter:
    """A copy of `drafter` whose logits cover only `draft_vocab` (sorted target ids): its LM head and
    Markov W2 keep those rows. With every id kept it drafts exactly what the original drafts."""
    cfg = drafter.config
    if cfg.pruned_vocab:
        raise ValueError("the drafter's vocabulary is already pruned")
    draft_vocab = torch.as_tensor(draft_vocab, dtype=torch.long)
    pruned_cfg = dataclasses.replace(cfg, draft_vocab_size=len(draft_vocab), own_lm_head=True)
    pruned = BlockDrafter(pruned_cfg, target).to(drafter.dtype)
    state = {k: v for k, v in drafter.state_dict().items()}
    head = drafter.lm_head if cfg.own_lm_head else drafter.shared.lm_head
    state["lm_head.weight"] = head.weight.detach()[draft_vocab]
    for name in kinds.drafter_kind(cfg.kind).vocab_rows:        # the kind's heads that score the vocabulary
        state[name] = state[name][draft_vocab]
    state["d2t"] = draft_vocab - torch.arange(len(draft_vocab))
    state["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    state["t2d"][draft_vocab] = True
    pruned.load_state_dict(state)
    pruned.check_vocab_map("pruned drafter")
    return pruned.eval().requires_grad_(False)
