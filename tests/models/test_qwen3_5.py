"""Qwen3.5 hybrid targets (transformers `qwen3_5`, `qwen3_5_moe`) against transformers, and their
recurrent-state rollback.

transformers is the reference for logits and plain greedy decoding (not for speculation: its cache
`crop` leaves rejected rows in the recurrent state). Rollback is checked bitwise against a run that
only ever saw the accepted rows.
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import hybrid_models as hm
from blockdraft.cache.state import StatePool
from blockdraft.errors import CheckpointError, ConfigError
from blockdraft.layers import cpu_kernels
from blockdraft.layers.deltanet import delta_rule
from blockdraft.layers.elementwise import lanewise
from blockdraft.loading import load_drafter, load_models, load_target
from conftest import on_threads

LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]
LAYOUT_IDS = ["dense", "dense-multimodal", "moe", "moe-multimodal"]


@pytest.mark.parametrize("moe,multimodal", LAYOUTS, ids=LAYOUT_IDS)
def test_logits_and_greedy_match_transformers(hybrid_root, moe, multimodal):
    hf = hm.hf_model(moe, multimodal)
    loaded = load_models(hm.checkpoint(str(hybrid_root), moe, multimodal), dtype="float32")
    ours = loaded.target
    prompt = torch.tensor([[5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 12]])
    with torch.no_grad():
        generated = hf.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
        ref = hf(generated).logits
    got = ours.logits(generated)
    assert (got - ref).abs().max().item() <= 1e-4
    # greedy decoding with our cache (prefill, then one row a step) gives transformers' tokens
    assert hm.greedy_with_cache(ours, prompt, 20) == generated[0].tolist()
    if multimodal:
        assert loaded.skipped_tensors.get("model.visual.*", 0) > 0


def test_mtp_and_vision_tensors_are_skipped_by_name(hybrid_root, tmp_path):
    src = hm.checkpoint(str(hybrid_root), False, True)
    dst = tmp_path / "with-mtp"
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors["mtp.fc.weight"] = torch.zeros(4, 4)
    save_file(tensors, str(dst / "model.safetensors"))
    skipped = load_models(dst).skipped_tensors
    assert skipped["mtp.*"] == 1 and skipped["model.visual.*"] > 0


def _bad_config(hybrid_root, tmp_path, edit) -> object:
    dst = tmp_path / "bad"
    shutil.copytree(hm.checkpoint(str(hybrid_root)), dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg, dst)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("edit,message", [
    (lambda c, d: c.update(layer_types=c["layer_types"][:-1]), "layer_types has 3 entries for num_hidden_layers=4"),
    (lambda c, d: c.update(layer_types=["linear_attention", "mamba2", "linear_attention", "full_attention"]),
     "layer_types entries ['mamba2'] are not supported"),
    (lambda c, d: c.update(linear_num_value_heads=3), "linear_num_value_heads=3 is not divisible"),
], ids=["layer-types-length", "unknown-layer-type", "heads"])
def test_malformed_configs_are_named_errors(hybrid_root, tmp_path, edit, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_target(_bad_config(hybrid_root, tmp_path, edit))


def test_missing_deltanet_tensor_is_a_named_error(hybrid_root, tmp_path):
    with pytest.raises(CheckpointError, match=r"missing tensors \['layers.1.linear_attn.A_log'\]"):
        load_target(_bad_config(hybrid_root, tmp_path, hm.without_tensor("model.layers.1.linear_attn.A_log")))


def test_missing_expert_is_a_named_error(hybrid_root, tmp_path):
    dst = tmp_path / "moe"
    shutil.copytree(hm.checkpoint(str(hybrid_root), True), dst)
    tensors = load_file(str(dst / "model.safetensors"))
    del tensors["model.layers.2.mlp.experts.4.up_proj.weight"]
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"layers.2.mlp.experts.4.up_proj.weight"):
        load_target(dst)


def test_drafter_taps_outside_the_target_are_a_named_error(hybrid_root):
    target = load_target(hm.checkpoint(str(hybrid_root)))
    with pytest.raises(ConfigError, match=r"target_layer_ids \[0, 4\]: \[4\] outside the target's \[0, 4\) layers"):
        load_drafter(hm.drafter_dir(hybrid_root, "dflash", taps=(0, 4)), target)


def test_int4_hybrid_target_runs_its_projections_quantized(hybrid_root):
    from blockdraft.layers.quant import QuantizedLinear, scheme_of
    target = load_target(hm.checkpoint(str(hybrid_root)), dtype="bfloat16", quantization="int4")
    deltanet, attention = target.layers[0].linear_attn, target.layers[3].self_attn
    assert all(isinstance(m, QuantizedLinear) for m in (deltanet.in_proj_qkv, deltanet.out_proj, attention.q_proj,
                                                        attention.o_proj, target.layers[0].mlp.down_proj))
    assert scheme_of(target) == "int4" and target.fused is None
    ref = load_target(hm.checkpoint(str(hybrid_root)), dtype="float32").logits([[5, 17, 3, 88, 41]])
    got = target.logits([[5, 17, 3, 88, 41]]).float()
    assert torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.98


@pytest.mark.parametrize("speculators", [False, True], ids=["zlab-deepspec", "speculators"])
@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_drafters_load_against_hybrid_targets_tapping_deltanet_and_attention(hybrid_root, kind, speculators):
    target = load_target(hm.checkpoint(str(hybrid_root)))
    taps = (1, 3)                                     # a DeltaNet layer and the attention layer
    d = load_drafter(hm.drafter_dir(hybrid_root, kind, taps, layout="speculators" if speculators else "zlab"), target)
    assert d.config.kind == kind and d.config.target_layer_ids == taps
    assert [target.config.layer_type(i) for i in taps] == ["linear_attention", "full_attention"]


def _states(pool: StatePool, slot: int) -> list[torch.Tensor]:
    return [t[slot].clone() for i in pool.layers for t in (pool.windows[i], pool.rec[i])]


@pytest.mark.parametrize("recurrence", ["kernel", "torch"])
@pytest.mark.parametrize("rollback", ["replay", "per_row"])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_rollback_is_bitwise_the_state_of_the_accepted_rows(hybrid_root, moe, rollback, recurrence, monkeypatch):
    """For every accept length 0..block: after a verify over [anchor, 5 drafts] keeps j rows, the state
    is bitwise the state of a run that saw the prompt and then only those j rows — with the C recurrence
    and with the PyTorch one (what runs where no C compiler is found)."""
    if recurrence == "torch":
        monkeypatch.setattr(cpu_kernels, "delta_rule", lambda *args: None)
    elif not cpu_kernels.available():
        pytest.skip("the CPU kernels did not build (reported in the summary; CI fails on it)")
    target = load_target(hm.checkpoint(str(hybrid_root), moe), dtype="bfloat16")
    cfg = target.config
    prompt = torch.tensor([[7, 30, 2, 55, 19, 64, 8]])
    block = torch.tensor([[11, 40, 3, 90, 27, 6]])
    with torch.inference_mode():
        for keep in range(block.shape[1] + 1):
            spec = target.new_cache(1, 32)
            spec.states = StatePool(cfg.state_layout, 1, target.dtype, rollback=rollback)
            spec.states.acquire()
            target(prompt, spec)
            spec.truncate(prompt.shape[1])
            target(block, spec)                              # verify: every row advances the working state
            spec.truncate(prompt.shape[1] + keep)            # rollback to the accepted rows
            # the reference: one fresh pass over prompt + the kept rows; its state is read off that pass
            # itself (the conv's last K-1 inputs, the recurrence's final state), not through any commit
            fresh = target.new_cache(1, 32)
            target(torch.cat([prompt, block[:, :keep]], dim=1), fresh)
            records = fresh._pending[2].records
            k = cfg.deltanet.conv_kernel
            reference = [t for i in sorted(records) for t in (records[i].rows[0, -(k - 1):], records[i].final[0])]
            for a, b in zip(_states(spec.states, 0), reference, strict=True):
                assert torch.equal(a, b), f"keep={keep}"


@pytest.mark.parametrize("recurrence", ["kernel", "torch"])
def test_delta_rule_rows_do_not_depend_on_the_batch(recurrence, monkeypatch):
    """A sequence's outputs and state are the same bits alone or beside seven others (Qwen3.5-sized heads)."""
    if recurrence == "torch":
        monkeypatch.setattr(cpu_kernels, "delta_rule", lambda *args: None)
    g = torch.Generator().manual_seed(0)
    b, t, h, dk, dv = 8, 3, 8, 128, 128
    state = torch.randn(b, h, dk, dv, generator=g)
    q, k = torch.randn(b, t, h, dk, generator=g) * 0.1, torch.randn(b, t, h, dk, generator=g) * 0.1
    v, gate, beta = torch.randn(b, t, h, dv, generator=g), -torch.rand(b, t, h, generator=g), torch.rand(b, t, h, generator=g)
    out, final, _ = delta_rule(state, q, k, v, gate, beta)
    for i in (0, 5):
        o1, f1, _ = delta_rule(state[i:i + 1], q[i:i + 1], k[i:i + 1], v[i:i + 1], gate[i:i + 1], beta[i:i + 1])
        assert torch.equal(o1[0], out[i]) and torch.equal(f1[0], final[i])


def test_delta_rule_kernel_agrees_with_the_torch_spelling_at_any_thread_count():
    if not cpu_kernels.available():
        pytest.skip("the CPU kernels did not build (reported in the summary; CI fails on it)")
    g = torch.Generator().manual_seed(1)
    b, t, h, dk, dv = 3, 6, 4, 32, 16
    state = torch.randn(b, h, dk, dv, generator=g)
    q, k = torch.randn(b, t, h, dk, generator=g) * 0.2, torch.randn(b, t, h, dk, generator=g) * 0.2
    v, gate, beta = torch.randn(b, t, h, dv, generator=g), -torch.rand(b, t, h, generator=g), torch.rand(b, t, h, generator=g)
    valid = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True] + [False] * 5])
    decay = lanewise(torch.exp, gate)
    fast = cpu_kernels.delta_rule(state, q, k, v, decay, beta, valid, True)
    single = on_threads(1, lambda: cpu_kernels.delta_rule(state, q, k, v, decay, beta, valid, True))
    assert all(torch.equal(a, c) for a, c in zip(fast, single))
    cpu_kernels_delta = cpu_kernels.delta_rule
    try:
        cpu_kernels.delta_rule = lambda *args: None
        ref = delta_rule(state, q, k, v, gate, beta, valid, True)
    finally:
        cpu_kernels.delta_rule = cpu_kernels_delta
    torch.testing.assert_close(fast[0][valid], ref[0][valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast[1], ref[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast[2], ref[2], rtol=1e-5, atol=1e-5)
    assert torch.equal(fast[1][2], state[2] * 0 + fast[2][2, 0])     # one valid row: the state after it


def test_lanewise_gives_an_element_the_same_bits_at_any_length():
    from torch.nn import functional as F
    x = torch.randn(40_000, generator=torch.Generator().manual_seed(3)) * 4
    for fn in (torch.exp, torch.sigmoid, F.softplus, F.silu):
        whole = lanewise(fn, x)
        for n in (1, 5, 31, 100, 20_001):
            assert torch.equal(lanewise(fn, x[:n]), whole[:n]), (fn, n)
