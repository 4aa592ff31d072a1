"""gpt-oss targets (transformers `gpt_oss`): sliding-window layers whose window is per-sequence state
(`cache/state.py`), attention sinks, the top-k-then-softmax MoE with the clamped SwiGLU, and the MXFP4
experts as published — against transformers, rolled back across the window edge, lossless in the engine."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import hybrid_models as hm
from blockdraft.checkpoints import mxfp4
from blockdraft.errors import CheckpointError, ConfigError
from blockdraft.loading import load_drafter, load_target

PROMPT = torch.tensor([[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 12, 40, 7, 19]])     # 14 tokens > window 8


def checkpoint(root):
    return hm.checkpoint(str(root), arch="gpt_oss")


def test_logits_and_greedy_match_transformers(hybrid_root):
    hf = hm.gpt_oss_model()
    ours = load_target(checkpoint(hybrid_root), dtype="float32")
    c = ours.config
    assert c.layer_types == ("sliding_attention", "full_attention") * 2 and c.sliding_window == hm.WINDOW
    assert c.attention_layers == [1, 3] and c.state_layers == [0, 2]           # windows are state, not paged KV
    with torch.no_grad():
        generated = hf.generate(PROMPT, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
        ref = hf(generated).logits
    assert (ours.logits(generated) - ref).abs().max().item() <= 1e-4
    assert hm.greedy_with_cache(ours, PROMPT, 20) == generated[0].tolist()


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, out, in] -> (blocks [E, out, in/32, 16], scales [E, out, in/32]): a power-of-two scale per
    group of 32 (the smallest that fits the group's largest value as 6), each value the nearest E2M1 code."""
    lut = torch.tensor(mxfp4.E2M1[:8])
    g = w.float().reshape(*w.shape[:-1], -1, 32)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(2.0 ** -100)
    exp = torch.ceil(torch.log2(amax / 6.0))
    q = g / torch.exp2(exp)
    code = (q.abs()[..., None] - lut).abs().argmin(-1) | ((q < 0).long() << 3)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)
    return blocks, (exp[..., 0] + 127).to(torch.uint8)


def mxfp4_checkpoint(root, tmp_path):
    """The tiny gpt-oss as openai publishes gpt-oss: experts as MXFP4 blocks and scales [E, out, in/32, ...]."""
    dst = tmp_path / "mxfp4"
    shutil.copytree(checkpoint(root), dst)
    tensors = load_file(str(dst / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = quantize_mxfp4(tensors.pop(name).transpose(1, 2))          # [E, in, out] -> [E, out, in]
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    save_file(tensors, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_mxfp4_experts_load_as_transformers_dequantizes_them(hybrid_root, tmp_path):
    import transformers as tf
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    path = mxfp4_checkpoint(hybrid_root, tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    blocks, scales = tensors["model.layers.1.mlp.experts.down_proj_blocks"], tensors["model.layers.1.mlp.experts.down_proj_scales"]
    assert torch.equal(mxfp4.dequantize(blocks, scales).transpose(1, 2), convert_moe_packed_tensors(blocks, scales))
    hf = tf.GptOssForCausalLM.from_pretrained(path, dtype=torch.float32).float().eval()    # experts load as bf16
    ours = load_target(path, dtype="float32")
    ids = torch.randint(0, hm.VOCAB, (1, 20))
    with torch.no_grad():
        assert (ours.logits(ids) - hf(ids).logits).abs().max().item() <= 1e-4


def test_rollback_across_the_window_edge_is_bitwise(hybrid_root):
    """Verify 6 rows on a 12-token prefix (window 8), keep 0..6."""
    target = load_target(checkpoint(hybrid_root), dtype="bfloat16")
    hm.check_rollback(target, PROMPT[:, :12], torch.tensor([[11, 40, 3, 90, 27, 6]]))


def test_int4_runs_every_expert_at_4_bits_with_its_biases(hybrid_root):
    """--quantization int4 converts the stacked experts too (one weight-only layer per expert and
    projection): each expert's output is its dequantized weight's, bias included, and a row's does not
    depend on how many rows the expert runs on."""
    from blockdraft.layers.linear import stable_linear
    from blockdraft.layers.quant import QuantizedExperts
    bf16 = load_target(checkpoint(hybrid_root), dtype="bfloat16")
    int4 = load_target(checkpoint(hybrid_root), dtype="bfloat16", quantization="int4")
    ex, ref = int4.layers[1].mlp.experts, bf16.layers[1].mlp.experts
    assert isinstance(ex, QuantizedExperts) and len(ex.gate_up_e) == len(ex.down_e) == int4.config.moe.num_experts
    x = torch.randn(5, int4.config.hidden_size).bfloat16()
    for e in (0, 3):
        layer = ex.gate_up_e[e]
        assert torch.equal(layer.bias, ref.gate_up_proj_bias[e])
        assert torch.allclose(ex.gate_up(e, x).float(), stable_linear(x, layer.weight, layer.bias).float(),
                              atol=0.02, rtol=0.02)
        assert torch.equal(ex.gate_up(e, x)[2:3], ex.gate_up(e, x[2:3]))
        err = (layer.weight.float() - ref.gate_up_proj[e].float()).abs().max()
        assert 0 < err <= ref.gate_up_proj[e].float().abs().max() / 7        # within one 4-bit level of the group
    ids = torch.randint(0, hm.VOCAB, (1, 12))
    with torch.no_grad():
        assert torch.nn.functional.cosine_similarity(int4.logits(ids).float().flatten(),
                                                     bf16.logits(ids).float().flatten(), dim=0) > 0.95


@pytest.mark.parametrize("quantization", ["none", "int4"])
def test_speculative_equals_plain_and_the_cache_free_loop(hybrid_root, quantization):
    target = load_target(checkpoint(hybrid_root), dtype="bfloat16", quantization=quantization)
    drafter = load_drafter(hm.trained_drafter_dir(str(hybrid_root), "dspark", False, "gpt_oss"), target)
    hm.check_speculative_equals_plain(target, drafter)


def _edited(root, tmp_path, edit):
    return hm.edited_checkpoint(checkpoint(root), tmp_path / "bad", edit)


def test_malformed_checkpoints_are_named_errors(hybrid_root, tmp_path):
    with pytest.raises(ConfigError, match="sliding_window must be an integer >= 2, got 0"):
        load_target(_edited(hybrid_root, tmp_path / "a", lambda c, d: c.update(sliding_window=0)))
    with pytest.raises(ConfigError, match="quant_method='gptq' is not supported for gpt_oss"):
        load_target(_edited(hybrid_root, tmp_path / "b",
                            lambda c, d: c.update(quantization_config={"quant_method": "gptq"})))

    def drop_scales(cfg, d):
        shutil.copy(mxfp4_checkpoint(hybrid_root, tmp_path / "c0") / "model.safetensors", d / "model.safetensors")
        tensors = load_file(str(d / "model.safetensors"))
        del tensors["model.layers.2.mlp.experts.gate_up_proj_scales"]
        save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing tensors layers.2.mlp.experts.gate_up_proj_scales"):
        load_target(_edited(hybrid_root, tmp_path / "c", drop_scales))

    def both_forms(cfg, d):
        shutil.copy(mxfp4_checkpoint(hybrid_root, tmp_path / "e0") / "model.safetensors", d / "model.safetensors")
        tensors = load_file(str(d / "model.safetensors"))
        tensors["model.layers.0.mlp.experts.down_proj"] = torch.zeros(4, 64, 64)
        save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="down_proj is in the checkpoint both as bf16 and as MXFP4"):
        load_target(_edited(hybrid_root, tmp_path / "e", both_forms))
    with pytest.raises(CheckpointError, match=r"missing tensors \['layers.2.mlp.experts.down_proj_bias'\]"):
        load_target(_edited(hybrid_root, tmp_path / "f",
                            hm.without_tensor("model.layers.2.mlp.experts.down_proj_bias")))
    with pytest.raises(ConfigError, match=r"target config.json has no 'num_local_experts'"):
        load_target(_edited(hybrid_root, tmp_path / "g", lambda c, d: c.update(num_local_experts=None)))
    with pytest.raises(CheckpointError, match=r"missing tensors \['layers.1.self_attn.sinks'\]"):
        load_target(_edited(hybrid_root, tmp_path / "d", hm.without_tensor("model.layers.1.self_attn.sinks")))


def test_generation_stops_at_the_generation_config_eos_ids(hybrid_root, tmp_path):
    """gpt-oss lists three end tokens in generation_config.json (config.json names one): transformers'
    `generate` stops at each, and so do we."""
    import json
    import transformers as tf
    from blockdraft.llm import LLM
    from blockdraft.sampling.params import SamplingParams
    prompt = [[5, 17, 3, 88, 41, 9]]
    free = LLM(target=str(checkpoint(hybrid_root)), drafter=None, dtype="bfloat16").generate(
        prompt_token_ids=prompt, sampling_params=SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    stop = free[3]

    def published(cfg, d):
        (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [cfg["eos_token_id"], stop, 9]}))
    target = _edited(hybrid_root, tmp_path / "a", published)
    assert set(load_target(target).config.eos_token_ids) == set(tf.GenerationConfig.from_pretrained(target).eos_token_id)
    out = LLM(target=str(target), drafter=None, dtype="bfloat16").generate(
        prompt_token_ids=prompt, sampling_params=SamplingParams(max_tokens=12))[0]
    assert out.token_ids == free[:free.index(stop) + 1] and out.finish_reason == "stop"

    def bad(cfg, d):
        (d / "generation_config.json").write_text(json.dumps({"eos_token_id": ["<|return|>"]}))
    with pytest.raises(ConfigError, match=r"eos_token_id must be a token id or a list of them, got \['<\|return\|>'\]"):
        load_target(_edited(hybrid_root, tmp_path / "b", bad))


def test_zlab_gpt_oss_dflash_layout_loads(hybrid_root, tmp_path):
    """z-lab's gpt-oss DFlash drafters: Qwen3 blocks with q/k/v/o biases and the target's yarn RoPE."""
    src = hm.drafter_dir(hybrid_root, "dflash", taps=(0, 2), seed=4)
    dst = tmp_path / "zlab-gpt-oss"
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(attention_bias=True, rope_theta=150000.0, rope_scaling={
        "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096})
    (dst / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    for name in [n for n in tensors if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"))]:
        tensors[name.replace(".weight", ".bias")] = torch.randn(tensors[name].shape[0], generator=g) * 0.1
    save_file(tensors, str(dst / "model.safetensors"))
    target = load_target(checkpoint(hybrid_root), dtype="bfloat16")
    drafter = load_drafter(dst, target)
    attn = drafter.layers[0].self_attn
    assert drafter.config.rope.rope_type == "yarn" and attn.q_proj.bias is not None and attn.v_proj.bias is not None
    del tensors["layers.0.self_attn.k_proj.bias"]
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(CheckpointError, match="layers.0.self_attn.k_proj.bias"):
        load_drafter(dst, target)
