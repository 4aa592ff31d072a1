"""LFM2 targets (transformers `lfm2`, `lfm2_moe`): short-conv layers on the same per-sequence state interface as
Qwen3.5's DeltaNet (`cache/state.py`), against transformers, rolled back bitwise, lossless in the engine."""

import dataclasses

import pytest
import torch

import hybrid_models as hm
from conftest import runnable_isas
from blockdraft.errors import CheckpointError, ConfigError
from blockdraft.layers import cpu_kernels as kernels
from blockdraft.loading import load_target
from blockdraft.models.lfm2 import ShortConv


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_logits_and_greedy_match_transformers(hybrid_root, moe):
    hf = hm.lfm2_model(moe=moe)
    ours = load_target(hm.checkpoint(str(hybrid_root), moe, arch="lfm2"), dtype="float32")
    assert ours.config.layer_types == ("short_conv", "full_attention", "short_conv", "full_attention")
    if moe:       # the first layer dense, the rest routed with the checkpoint's (nonzero) expert bias
        assert [type(layer.mlp).__name__ for layer in ours.layers] == ["MLP"] + ["SparseMoe"] * 3
        assert ours.layers[2].mlp.expert_bias.abs().min() > 0
    prompt = torch.tensor([[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 12]])
    with torch.no_grad():
        generated = hf.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
        ref = hf(generated).logits
    assert (ours.logits(generated) - ref).abs().max().item() <= 1e-4
    assert hm.greedy_with_cache(ours, prompt, 20) == generated[0].tolist()


def test_tied_embeddings_and_the_published_defaults_load(tmp_path):
    import transformers as tf
    torch.manual_seed(3)
    config = tf.Lfm2Config(vocab_size=64, hidden_size=32, intermediate_size=96, num_hidden_layers=3,
                           num_attention_heads=2, num_key_value_heads=1, full_attn_idxs=[2], block_multiple_of=16)
    config._attn_implementation = "eager"
    hf = tf.Lfm2ForCausalLM(config).eval()              # tie_word_embeddings defaults to True, as LiquidAI ships
    hf.save_pretrained(tmp_path)
    ours = load_target(tmp_path, dtype="float32")
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        assert (ours.logits(ids) - hf(ids).logits).abs().max().item() <= 1e-4
    assert ours.config.tie_word_embeddings and ours.lm_head.weight is ours.embed_tokens.weight


# LiquidAI/LFM2-1.2B's config.json as published: LFM2's own spellings (`block_ff_dim`, `tie_embedding`,
# `full_attn_idxs`, `conv_L_cache`, `norm_eps`), no `intermediate_size`.
LFM2_1_2B = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 2048,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 128000,
    "block_ff_dim": 12288, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
    "full_attn_idxs": [2, 5, 8, 10, 12, 14], "conv_L_cache": 3, "conv_bias": False, "norm_eps": 1e-05,
    "rope_theta": 1000000.0, "tie_embedding": True, "bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}


def test_the_published_1_2b_config_resolves_as_transformers_builds_it():
    import transformers as tf
    from blockdraft.checkpoints.resolve import resolve_target
    ours = resolve_target(dict(LFM2_1_2B))
    hf = tf.Lfm2Config(**LFM2_1_2B)
    with torch.device("meta"):
        w1 = tf.models.lfm2.modeling_lfm2.Lfm2MLP(hf).w1.weight
    assert ours.intermediate_size == w1.shape[0] == 8192
    assert ours.tie_word_embeddings is hf.tie_word_embeddings is True
    assert ours.rope.theta == hf.rope_parameters["rope_theta"] == 1e6
    assert [t == "full_attention" for t in ours.layer_types] == [t == "full_attention" for t in hf.layer_types]
    assert ours.eos_token_ids == (7,) and ours.rms_norm_eps == 1e-5
    # the rope base left out: LFM2's default (1e6), not Llama's 1e4
    unset = {k: v for k, v in LFM2_1_2B.items() if k != "rope_theta"}
    assert resolve_target(unset).rope.theta == tf.Lfm2Config(**unset).rope_parameters["rope_theta"]


class _Window:
    """A short-conv layer's state step: its window of past rows in, the rows it records out."""

    def __init__(self, rows: torch.Tensor):
        self.rows, self.records = rows, {}

    def initial(self, layer):
        return self.rows, None

    def record(self, layer, rec):
        self.records[layer] = rec.rows


@pytest.mark.skipif(not kernels.available(), reason="no C compiler")
@pytest.mark.parametrize("rows, taps, bias, width", [(1, 3, False, None), (9, 3, True, None), (2, 4, False, 36)])
def test_the_short_conv_kernel_gives_the_bits_of_the_pytorch_spelling(hybrid_root, monkeypatch, rows, taps, bias,
                                                                       width):
    """bf16 inference on the CPU runs the conv and its gates in one kernel: the layer's output and the rows its
    state records equal, bit for bit, those of the PyTorch lines it stands in for (with and without a conv
    bias, 1 to 9 rows, 3 and 4 taps, a width with channels past the last 8), on every instruction-set path this
    machine runs."""
    cfg = load_target(hm.checkpoint(str(hybrid_root), arch="lfm2"), dtype="float32").config
    width = width or cfg.hidden_size
    cfg = dataclasses.replace(cfg, hidden_size=width, short_conv=dataclasses.replace(
        cfg.short_conv, conv_dim=width, conv_kernel=taps, bias=bias))
    torch.manual_seed(0)
    conv = ShortConv(cfg)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn_like(p) * 2)
    conv = conv.to(torch.bfloat16)
    h = cfg.hidden_size
    x = (torch.randn(2, rows, h) * torch.logspace(-2, 2, h)).bfloat16()
    past = torch.randn(2, taps - 1, h).bfloat16()
    outs = {}
    with torch.no_grad():
        proj, weight = conv.in_proj(x), conv.conv.weight[:, 0]
        paths = [kernels.short_conv(proj, past, weight, conv.conv.bias if bias else None, isa) for isa in runnable_isas()]
        for bx, y in paths[1:]:
            assert torch.equal(bx.view(torch.int16), paths[0][0].view(torch.int16))
            assert torch.equal(y.view(torch.int16), paths[0][1].view(torch.int16))
        for fused in (True, False):
            if not fused:
                monkeypatch.setattr(kernels, "short_conv", lambda *args: None)
            step = _Window(past)
            outs[fused] = (conv(x, step, 0), step.records[0])
    for a, b in zip(outs[True], outs[False]):
        assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.skipif(not kernels.available(), reason="no C compiler")
@pytest.mark.parametrize("quantization", ["int4", "int8", "int4-a8"])
def test_a_quantized_conv_layer_in_one_call_gives_the_bits_of_its_modules(hybrid_root, monkeypatch, quantization):
    """With weight-only linear layers, bf16 on the CPU, a short-conv layer runs in one kernel call; a prompt
    pass, a verify block and a decoding step give the logits and caches of the layer's modules, bit for bit;
    and the hybrid quantization's fused MLP gate-and-up and attention q-k-v give the separate projections' bits."""
    from blockdraft.layers.quant import QuantizedLinear
    from blockdraft.models.lfm2 import ShortConvLayer

    path = hm.checkpoint(str(hybrid_root), arch="lfm2")
    target = load_target(path, dtype="bfloat16", quantization=quantization)
    layer = target.layers[0]
    assert isinstance(layer, ShortConvLayer) and layer.mlp.gate_up_proj is not None
    g = torch.Generator().manual_seed(2)
    prompt, block, step = (torch.randint(0, target.config.vocab_size, (2, n), generator=g) for n in (7, 5, 1))
    calls = []
    real = kernels.conv_layer
    monkeypatch.setattr(kernels, "conv_layer", lambda *a, **k: calls.append(1) or real(*a, **k))
    outs = {}
    with torch.inference_mode():
        for one_call in (True, False):
            if not one_call:
                monkeypatch.setattr(ShortConvLayer, "_in_one_call", lambda *args: None)
            cache = target.new_cache(2, 16)
            logits = [target(prompt, cache).logits]
            cache.truncate(7)
            logits.append(target(block, cache).logits)
            cache.truncate(9)                                 # two of the block's rows kept: the state rolled back
            logits.append(target(step, cache).logits)
            outs[one_call] = logits
        assert len(calls) == 3 * sum(isinstance(m, ShortConvLayer) for m in target.layers)
        for a, b in zip(outs[True], outs[False]):
            assert torch.equal(a, b)
        plain = load_target(path, dtype="bfloat16")          # the checkpoint's projections, each on its own
        x = torch.randn(3, target.config.hidden_size, generator=g).bfloat16()
        attention = next(i for i, m in enumerate(target.layers) if not isinstance(m, ShortConvLayer))
        for fused, parts in ((layer.mlp.gate_up_proj, (plain.layers[0].mlp.gate_proj, plain.layers[0].mlp.up_proj)),
                             (target.layers[attention].self_attn.qkv_proj,
                              [getattr(plain.layers[attention].self_attn, n) for n in ("q_proj", "k_proj", "v_proj")])):
            alone = [QuantizedLinear(p.weight, None, quantization)(x) for p in parts]
            assert torch.equal(fused(x), torch.cat(alone, -1))


def test_rollback_is_bitwise_the_state_of_the_accepted_rows(hybrid_root):
    target = load_target(hm.checkpoint(str(hybrid_root), arch="lfm2"), dtype="bfloat16")
    k = target.config.short_conv.conv_kernel
    prompt = torch.tensor([[7, 30, 2, 55, 19, 64, 8]])
    block = torch.tensor([[11, 40, 3, 90, 27, 6]])
    with torch.inference_mode():
        for keep in range(block.shape[1] + 1):
            spec = target.new_cache(1, 32)
            target(prompt, spec)
            spec.truncate(prompt.shape[1])
            target(block, spec)
            spec.truncate(prompt.shape[1] + keep)
            fresh = target.new_cache(1, 32)
            target(torch.cat([prompt, block[:, :keep]], dim=1), fresh)
            records = fresh._pending[2].records
            for i in spec.states.layers:
                assert torch.equal(spec.states.windows[i][0], records[i].rows[0, -(k - 1):]), f"keep={keep}"
            assert not spec.states.rec                       # short conv: no recurrence to keep


@pytest.mark.parametrize("moe, quantization", [(False, "none"), (False, "int4"), (True, "none")],
                         ids=["dense-bf16", "dense-int4", "moe-bf16"])
def test_speculative_equals_plain_and_the_cache_free_loop(hybrid_root, moe, quantization):
    from blockdraft.loading import load_drafter
    target = load_target(hm.checkpoint(str(hybrid_root), moe, arch="lfm2"), dtype="bfloat16",
                         quantization=quantization)
    drafter = load_drafter(hm.trained_drafter_dir(str(hybrid_root), "dspark", moe, "lfm2"), target)
    hm.check_speculative_equals_plain(target, drafter)


def _edited(hybrid_root, tmp_path, edit, moe=False):
    return hm.edited_checkpoint(hm.checkpoint(str(hybrid_root), moe, arch="lfm2"), tmp_path / "bad", edit)


def test_malformed_checkpoints_are_named_errors(hybrid_root, tmp_path):
    with pytest.raises(ConfigError, match="layer_types has 3 entries for num_hidden_layers=4"):
        load_target(_edited(hybrid_root, tmp_path / "a", lambda c, d: c.update(layer_types=["conv"] * 3)))
    with pytest.raises(ConfigError, match=r"layer_types entries \['mamba2'\] are not supported"):
        load_target(_edited(hybrid_root, tmp_path / "b", lambda c, d: c.update(layer_types=["mamba2"] * 4)))
    with pytest.raises(CheckpointError, match=r"missing tensors \['layers.2.conv.conv.weight'\]"):
        load_target(_edited(hybrid_root, tmp_path / "c", hm.without_tensor("model.layers.2.conv.conv.weight")))


def test_malformed_moe_checkpoints_are_named_errors(hybrid_root, tmp_path):
    with pytest.raises(ConfigError, match="num_dense_layers=5 exceeds num_hidden_layers=4"):
        load_target(_edited(hybrid_root, tmp_path / "a", lambda c, d: c.update(num_dense_layers=5), moe=True))
    with pytest.raises(ConfigError, match="num_experts_per_tok=7 exceeds num_experts=6"):
        load_target(_edited(hybrid_root, tmp_path / "b", lambda c, d: c.update(num_experts_per_tok=7), moe=True))
    with pytest.raises(CheckpointError, match=r"missing tensors layers.3.feed_forward.experts.4.w3.weight"):
        load_target(_edited(hybrid_root, tmp_path / "c",
                            hm.without_tensor("model.layers.3.feed_forward.experts.4.w3.weight"), moe=True))
