"""Drafters trained with interleaved (GPT-J) RoPE — LiquidAI's LFM2.5 DSpark layout, `rope_is_neox_style:
false` — draft what a GPT-J rotation computes, and save back in the layout they came in."""

import json

import pytest
import torch
from safetensors.torch import load_file

import hybrid_models as hm
from blockdraft.checkpoints.publish import save_drafter
from blockdraft.errors import ConfigError
from blockdraft.loading import load_drafter, load_target


def gptj_rope(x, cos, sin):
    """The reference rotation: pairs (x[2i], x[2i+1]) by angle i (cos/sin as `Rotary.cos_sin` builds them)."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., half:]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)


def liquid_layout(hybrid_root, tmp_path, neox: bool | None):
    """The tiny DSpark drafter rewritten as LiquidAI publishes: `Lfm2DSparkDraftModel`, taps under
    `dflash_config`, and `rope_is_neox_style` (None: the key absent)."""
    src = hm.drafter_dir(hybrid_root, "dspark", taps=(0, 2), seed=5)
    dst = tmp_path / f"liquid-{neox}"
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["Lfm2DSparkDraftModel"]
    cfg["dflash_config"] = cfg.pop("dspark_config")
    if neox is not None:
        cfg["rope_is_neox_style"] = neox
    (dst / "config.json").write_text(json.dumps(cfg))
    (dst / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    return dst


def draft_logits(drafter, target, prompt):
    cache = drafter.new_cache(1, 64)
    drafter.extend_context(target(prompt, target.new_cache(1, 64), drafter.config.taps).taps, cache)
    return drafter.logits(drafter.block_hidden(prompt[0, -1:], drafter.config.block_size, cache))


@torch.inference_mode()
def test_interleaved_drafter_drafts_the_gptj_rotation(hybrid_root, tmp_path, monkeypatch):
    import blockdraft.models.drafter as drafter_module
    target = load_target(hm.checkpoint(str(hybrid_root), arch="lfm2"), dtype="float32")
    prompt = torch.tensor([[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 12, 40, 7]])
    ours = load_drafter(liquid_layout(hybrid_root, tmp_path, neox=False), target)
    assert ours.config.kind == "dspark" and ours.config.rope_interleaved
    got = draft_logits(ours, target, prompt)
    neox = load_drafter(liquid_layout(hybrid_root, tmp_path, neox=None), target)
    assert not neox.config.rope_interleaved
    as_neox = draft_logits(neox, target, prompt)
    monkeypatch.setattr(drafter_module, "apply_rope", gptj_rope)   # the same weights, rotated GPT-J style
    reference = draft_logits(neox, target, prompt)
    assert (got - reference).abs().max().item() <= 1e-4
    assert (as_neox - reference).abs().max().item() > 1e-2           # the layout matters at these weights


def test_saved_interleaved_drafter_keeps_its_layout(hybrid_root, tmp_path):
    target = load_target(hm.checkpoint(str(hybrid_root), arch="lfm2"), dtype="bfloat16")
    src = liquid_layout(hybrid_root, tmp_path, neox=False)
    out = save_drafter(load_drafter(src, target), target, tmp_path / "saved")
    assert json.loads((out / "config.json").read_text())["rope_is_neox_style"] is False
    original, saved = load_file(str(src / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for name in ("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
                 "layers.0.self_attn.q_norm.weight"):
        assert torch.equal(saved[name], original[name].to(torch.bfloat16)), name
    assert load_drafter(out, target).config.rope_interleaved


def test_rope_layout_spellings_are_checked(hybrid_root, tmp_path):
    target = load_target(hm.checkpoint(str(hybrid_root), arch="lfm2"), dtype="bfloat16")
    bad = liquid_layout(hybrid_root, tmp_path, neox=False)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "rope_is_neox_style": "no"}))
    with pytest.raises(ConfigError, match="drafter rope_is_neox_style must be true or false, got 'no'"):
        load_drafter(bad, target)
    (bad / "config.json").write_text(json.dumps({**cfg, "is_neox_style": True}))
    with pytest.raises(ConfigError, match="disagrees on the RoPE layout"):
        load_drafter(bad, target)


def test_interleaved_rows_must_be_whole_heads(hybrid_root, tmp_path):
    from safetensors.torch import save_file
    from blockdraft.errors import CheckpointError
    target = load_target(hm.checkpoint(str(hybrid_root), arch="lfm2"), dtype="bfloat16")
    path = liquid_layout(hybrid_root, tmp_path, neox=False)
    tensors = load_file(str(path / "model.safetensors"))
    tensors["layers.0.self_attn.q_proj.weight"] = tensors["layers.0.self_attn.q_proj.weight"][:-3]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="layers.0.self_attn.q_proj.weight has 61 rows, not whole heads"):
        load_drafter(path, target)
