"""Gemma 4 targets (transformers `gemma4`, `gemma4_text`): per-layer head geometry, k = v, shared-KV
layers, per-layer embeddings, softcapping and the MoE variant, with sliding-window layers on the per-
sequence state interface — against transformers, rolled back across the window edge, lossless in the engine."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import hybrid_models as hm
from blockdraft.errors import CheckpointError, ConfigError
from blockdraft.loading import load_drafter, load_models, load_target

PROMPT = torch.tensor([[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 12]])     # 11 tokens > window 4


def checkpoint(root, moe=False, multimodal=False):
    return hm.checkpoint(str(root), moe, multimodal, arch="gemma4")


@pytest.mark.parametrize("moe, multimodal", [(False, False), (True, False), (True, True)],
                         ids=["dense", "moe", "moe-multimodal"])
def test_logits_and_greedy_match_transformers(hybrid_root, moe, multimodal):
    hf = hm.gemma4_model(moe, multimodal)
    loaded = load_models(checkpoint(hybrid_root, moe, multimodal), dtype="float32")
    ours, c = loaded.target, loaded.target.config
    assert c.attention_layers == [2] and c.state_layers == [0, 1, 3, 4]     # layers 5-7 reuse 2 and 4
    assert [c.kv_source(i) for i in (5, 6, 7)] == [2, 4, 2] and c.kv_geometry(2) == ((1, 32) if moe else (2, 32))
    if multimodal:
        assert set(loaded.skipped_tensors) >= {"model.vision_tower.*", "model.audio_tower.*"}
    with torch.no_grad():
        generated = hf.generate(PROMPT, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        ref = hf(generated).logits
    assert (ours.logits(generated) - ref).abs().max().item() <= 1e-4
    assert hm.greedy_with_cache(ours, PROMPT, 16) == generated[0].tolist()


def test_tied_embeddings_as_published_load(tmp_path):
    """Gemma 4 ships tied embeddings (transformers' default): no lm_head tensor in the files."""
    import transformers as tf
    torch.manual_seed(5)
    cfg = hm.gemma4_text_config(False, tie_word_embeddings=True)
    hf = tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**cfg)).eval()
    hf.save_pretrained(tmp_path)
    assert "lm_head.weight" not in load_file(str(tmp_path / "model.safetensors"))
    ours = load_target(tmp_path, dtype="float32")
    assert ours.config.tie_word_embeddings and ours.lm_head.weight is ours.embed_tokens.weight
    with torch.no_grad():
        assert (ours.logits(PROMPT) - hf(PROMPT).logits).abs().max().item() <= 1e-4


def test_published_shared_layer_kv_tensors_are_set_aside(hybrid_root, tmp_path):
    """Published E2B/E4B files carry k/v projections for the shared-KV layers, which never run them."""
    dst = tmp_path / "published"
    shutil.copytree(checkpoint(hybrid_root), dst)
    tensors = load_file(str(dst / "model.safetensors"))
    for i in (5, 6, 7):
        tensors[f"model.layers.{i}.self_attn.k_proj.weight"] = torch.zeros(32, 64)
        tensors[f"model.layers.{i}.self_attn.k_norm.weight"] = torch.ones(16)
    save_file(tensors, str(dst / "model.safetensors"))
    loaded = load_models(dst, dtype="float32")
    ours = loaded.target
    assert loaded.skipped_tensors == {"shared-KV layers' k/v *": 6}
    assert torch.equal(ours.logits(PROMPT), load_target(checkpoint(hybrid_root), dtype="float32").logits(PROMPT))


def test_rollback_across_the_window_edge_is_bitwise(hybrid_root):
    target = load_target(checkpoint(hybrid_root, True), dtype="bfloat16")
    hm.check_rollback(target, PROMPT[:, :9], torch.tensor([[11, 40, 3, 90, 27, 6]]))


@pytest.mark.parametrize("moe, quantization", [(True, "none"), (False, "int4")], ids=["moe-bf16", "dense-int4"])
def test_speculative_equals_plain_and_the_cache_free_loop(hybrid_root, moe, quantization):
    target = load_target(checkpoint(hybrid_root, moe), dtype="bfloat16", quantization=quantization)
    drafter = load_drafter(hm.trained_drafter_dir(str(hybrid_root), "dspark", moe, "gemma4"), target)
    hm.check_speculative_equals_plain(target, drafter)


def _edited(root, tmp_path, edit, moe=False):
    return hm.edited_checkpoint(checkpoint(root, moe), tmp_path / "bad", edit)


def test_malformed_checkpoints_are_named_errors(hybrid_root, tmp_path):
    with pytest.raises(ConfigError, match="use_bidirectional_attention='all'"):
        load_target(_edited(hybrid_root, tmp_path / "a", lambda c, d: c.update(use_bidirectional_attention="all")))
    with pytest.raises(ConfigError, match=r"num_kv_shared_layers=8 must be in \[0, num_hidden_layers=8\)"):
        load_target(_edited(hybrid_root, tmp_path / "b", lambda c, d: c.update(num_kv_shared_layers=8)))
    with pytest.raises(ConfigError, match="per_layer_config overrides layer 01, which is not a full-attention layer"):
        load_target(_edited(hybrid_root, tmp_path / "c",
                            lambda c, d: c.update(per_layer_config={"01": {"head_dim": 32}})))
    with pytest.raises(CheckpointError, match=r"missing tensors \['layers.3.layer_scalar'\]"):
        load_target(_edited(hybrid_root, tmp_path / "d", hm.without_tensor("model.layers.3.layer_scalar")))


def test_malformed_moe_checkpoints_are_named_errors(hybrid_root, tmp_path):
    with pytest.raises(ConfigError, match=r"target config.json has no 'num_experts' \(it is null\)"):
        load_target(_edited(hybrid_root, tmp_path / "a", lambda c, d: c.update(num_experts=None), moe=True))
    def three_heads(cfg, d):
        for layer in cfg["per_layer_config"].values():
            layer["num_key_value_heads"] = 3
    with pytest.raises(ConfigError, match="per_layer_config num_key_value_heads=3 does not divide num_attention_heads=4"):
        load_target(_edited(hybrid_root, tmp_path / "b", three_heads, moe=True))
    older = {"per_layer_config": None, "num_global_key_value_heads": 3}       # the pre-5.15 spelling
    with pytest.raises(ConfigError, match="num_global_key_value_heads=3 does not divide num_attention_heads=4"):
        load_target(_edited(hybrid_root, tmp_path / "b2", lambda c, d: c.update(older), moe=True))
    with pytest.raises(CheckpointError, match=r"missing tensors \['layers.2.experts.gate_up_proj'\]"):
        load_target(_edited(hybrid_root, tmp_path / "c", hm.without_tensor("model.layers.2.experts.gate_up_proj"),
                            moe=True))


def test_the_multimodal_head_is_tied_by_the_outer_config():
    """transformers ties Gemma4ForConditionalGeneration's head by the outer config (default True), whatever
    `text_config` says."""
    import transformers as tf
    from blockdraft.checkpoints.resolve import resolve_target
    text = hm.gemma4_text_config(False, tie_word_embeddings=False)
    for outer in ({}, {"tie_word_embeddings": False}):
        cfg = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text, **outer}
        hf = tf.Gemma4Config(text_config=text, **outer)
        assert resolve_target(cfg).tie_word_embeddings is hf.tie_word_embeddings is outer.get("tie_word_embeddings", True)


def test_dspark_training_teaches_the_capped_distribution(hybrid_root):
    """The target's logits are soft-capped (30): the DSpark loss's teacher is that distribution."""
    from blockdraft.train.losses import blocks_at
    from blockdraft.train.trainer import teacher_data
    target = load_target(checkpoint(hybrid_root), dtype="float32")
    drafter = load_drafter(hm.drafter_dir(hybrid_root, "dspark"), target)
    seq = teacher_data(target, [PROMPT[0].tolist()], 6, drafter.config.taps)[0]
    anchors = torch.tensor([3, 7])
    block = blocks_at(drafter, seq.taps, seq.final, seq.ids, anchors, target.lm_head)
    positions = (anchors[:, None] + torch.arange(drafter.config.num_draft_tokens)).reshape(-1)   # predicted - 1
    with torch.no_grad():
        full = target.logits(seq.ids[None])[0]
    assert (block.target_logits - full[positions]).abs().max().item() <= 1e-4
