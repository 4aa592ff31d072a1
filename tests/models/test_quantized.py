"""Weight-only int8 / int4 targets: every row rounds as a one-row step does, so speculation is
lossless against the quantized model (which is a different model from its bf16 source)."""

import shutil

import pytest
import torch
from torch.nn import functional as F

from decode_oracle import generate_one
from blockdraft.cache.paged import PagedKVPool, PagedStep, pad_tables
from blockdraft.errors import ConfigError
from blockdraft.layers import cpu_kernels as kernels
from blockdraft.layers.quant import QuantizedLinear, check_scheme, scheme_of
from blockdraft.layers.vocab import argmax_ids
from blockdraft.llm import LLM
from blockdraft.numerics import cpu_flags
from blockdraft.loading import load_drafter, load_target
from blockdraft.sampling.params import SamplingParams
from conftest import ASSETS, DRAFTER_NAMES, on_threads, random_prompts, runnable_isas
from tiny_models import row_pass_target

PROMPTS = random_prompts(4, seed=81)
KERNELS = ["qgemm", "torch"]


def test_own_kernel_builds_where_there_is_a_compiler():
    """CI machines have a C compiler: the quantized layers must run blockdraft's kernel there, not the fallback."""
    assert (shutil.which("cc") or shutil.which("gcc")) is None or kernels.available()
    if kernels.available() and "avx2" in cpu_flags():          # an AVX2 machine runs a vector path
        assert kernels.best_isa() != "portable"


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("scheme", ["int8", "int4", "int8_g32", "int4-a8", "int8_g32-a8"])
@pytest.mark.parametrize("shape", [(192, 576), (1536, 576), (576, 1536)])
def test_quantized_rows_independent_of_row_count(scheme, shape, kernel):
    if scheme.endswith("-a8") and kernel == "torch":
        pytest.skip("8-bit activations run on the own kernel only (test_8bit_activations_need_the_own_kernel)")
    g = torch.Generator().manual_seed(0)
    layer = QuantizedLinear(torch.randn(shape, generator=g) * 0.05, None, scheme, kernel)
    x = torch.randn(72, shape[1], generator=g).bfloat16()
    one = torch.cat([layer(x[i:i + 1]) for i in range(72)])
    for rows in (2, 9, 16, 17, 33, 72):          # the own kernel keeps 32 rows per pass over a tile
        assert torch.equal(layer(x[:rows]), one[:rows]), rows
    ref = x.float() @ layer.weight.float().T                                 # the dequantized weight
    torch.testing.assert_close(layer(x).float(), ref, rtol=0.02, atol=0.05)


@pytest.mark.parametrize("act_bits", [16, 8])
@pytest.mark.parametrize("bits", [4, 8])
def test_own_kernel_gives_the_same_bits_on_every_instruction_set_and_thread_count(bits, act_bits):
    """AVX512-VNNI, AVX2 and portable C sum the same integers and run the same float operations per row,
    with the activations at 16 bits and at 8 (where the paths that know it skip the zero lo bytes)."""
    g = torch.Generator().manual_seed(3)
    n, k = 96, 320
    w = torch.randn(n, k, generator=g) * torch.logspace(-2, 0, k)[torch.randperm(k, generator=g)]
    packed, scales = kernels.pack(w, bits)
    x = (torch.randn(11, k, generator=g) * torch.logspace(-3, 1, k)).bfloat16()
    x[10, :32] = torch.tensor([32512.0, -32512.0] + [s * (i + 0.5) for i in range(15) for s in (1, -1)])   # scale 1:
    x[10, 32:64] = torch.tensor([0.0, 1e-30] + [-0.0] * 30)                               # ties; tiny; zeros
    isas = runnable_isas()
    outs = {isa: kernels.matmul(x, packed, scales, bits, n, isa, act_bits=act_bits) for isa in isas}
    for isa in isas:
        assert torch.equal(outs[isa], outs["portable"]), isa
        for rows in range(1, 11):               # the VNNI path's passes of 1..9 rows (each its own code), 9 + 1
            assert torch.equal(kernels.matmul(x[:rows], packed, scales, bits, n, isa, act_bits=act_bits),
                               outs["portable"][:rows]), (isa, rows)
    assert torch.equal(on_threads(2, lambda: kernels.matmul(x, packed, scales, bits, n, act_bits=act_bits)),
                       outs["portable"])
    # what the kernel computes: the stored weight against the activations rounded to 16 (or 8) bits per 32
    groups = x.float().view(11, k // 32, 32)
    dx = groups.abs().amax(-1, keepdim=True) / (32512 if act_bits == 16 else 127)
    xq = (torch.round(groups / torch.where(dx > 0, dx, 1)) * dx).view(11, k)
    ref = xq.double() @ kernels.dequantize(packed, scales, bits, n, k).double().T
    torch.testing.assert_close(outs["portable"].double(), ref, rtol=1e-2, atol=1e-3 * ref.abs().max().item())


# every weight shape of the default model (SmolLM2-135M: q/k/v, o, gate/up, down, the 8-bit LM head) and of
# LFM2-1.2B (q/k/v, o and the short convolutions' in/out, gate/up, down), and tails: a group count that is
# no multiple of the tile pipeline's ring, one block of columns, an odd number of blocks
AMX_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576), (3072, 2048), (2048, 2048),
              (6144, 2048), (16384, 2048), (2048, 8192), (16, 352), (48, 32), (80, 224)]


@pytest.mark.skipif(not kernels.available() or kernels.best_isa() != "amx", reason="this CPU has no AMX tiles")
@pytest.mark.parametrize("act_bits", [16, 8])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shape", AMX_SHAPES)
def test_amx_tiles_give_the_vnni_bits_at_every_row_count(shape, bits, act_bits):
    """The int8 and bf16 tile layouts (8-bit activations: the tile of hi bytes only), and the per-pass choice
    between them and the VNNI path, sum the same integers and run the same float epilogue: every row count
    1..32 gives the VNNI path's bits."""
    n, k = shape
    if bits == 8 and n * k > 8 * 2 ** 20 and n != 49152:           # the 8-bit layer that ships is the LM head
        pytest.skip("8-bit weights of this shape do not ship (the body is 4-bit)")
    g = torch.Generator().manual_seed(n + k + bits)
    w = torch.randn(n, k, generator=g) * torch.logspace(-2, 0, k)[torch.randperm(k, generator=g)]
    packed, scales = kernels.pack(w, bits)
    x = (torch.randn(32, k, generator=g) * torch.logspace(-3, 1, k)).bfloat16()
    x[5, :32] = torch.tensor([32512.0, -32512.0] + [s * (i + 0.5) for i in range(15) for s in (1, -1)])
    x[7, -32:] = torch.tensor([0.0, 1e-30] + [-0.0] * 30)
    x[11] = 0
    vnni = kernels.matmul(x, packed, scales, bits, n, "avx512vnni", act_bits=act_bits)
    every = n * k <= 2 ** 21           # the large shapes at the row counts where a path or a pass changes
    for rows in range(1, 33) if every else (1, 2, 3, 8, 9, 15, 16, 17, 25, 32):
        for isa in ("amx", "amx-int8", "amx-bf16"):
            out = kernels.matmul(x[:rows], packed, scales, bits, n, isa, act_bits=act_bits)
            assert torch.equal(out.view(torch.int16), vnni[:rows].view(torch.int16)), (isa, rows)
    residual = torch.randn(9, n, generator=g).bfloat16()
    assert torch.equal(kernels.matmul(x[:9], packed, scales, bits, n, "amx", residual, act_bits),
                       kernels.matmul(x[:9], packed, scales, bits, n, "avx512vnni", residual, act_bits))


def test_own_kernel_keeps_the_q4_1_levels():
    """Weights already on a Q4_1 grid (the default model's GGUF, dequantized) come back on it."""
    g = torch.Generator().manual_seed(4)
    d = (torch.rand(64, 4, 1, generator=g) * 0.01).half().float()        # GGUF blocks keep d and m in fp16
    m = (torch.randn(64, 4, 1, generator=g) * 0.02).half().float()
    q = torch.randint(0, 16, (64, 4, 32), generator=g)
    q[..., 0], q[..., 1] = 0, 15                             # each group spans its whole range, as GGUF blocks do
    w = (d * q + m).view(64, 128)
    packed, scales = kernels.pack(w, 4)
    torch.testing.assert_close(kernels.dequantize(packed, scales, 4, 64, 128), w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("scheme", ["int8", "int4", "int8_g32"])
def test_quantization_error_is_small(scheme, kernel):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(256, 512, generator=g) * 0.05
    err = (QuantizedLinear(w, None, scheme, kernel).weight.float() - w).abs().max() / w.abs().max()
    assert err < {"int8": 0.01, "int8_g32": 0.01, "int4": 0.1}[scheme]


def test_grouped_8bit_head_is_closer_than_per_channel():
    """A row whose weights span a wide range: one scale per row loses its small weights, one per 32 does not."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 256, generator=g) * torch.logspace(-3, 0, 256)[torch.randperm(256, generator=g)]
    per_channel = QuantizedLinear(w, None, "int8", "torch")
    err = {name: ((layer.weight.float() - w).abs() / w.abs()).median() for name, layer in
           [("per channel", per_channel)] + [(k, QuantizedLinear(w, None, "int8_g32", k)) for k in KERNELS]}
    assert max(err["qgemm"], err["torch"]) < 0.5 * err["per channel"], err


@pytest.fixture(scope="module", params=["int8", "int4", "int4-a8"])
def quantized(request):
    target = load_target(ASSETS / "target-qwen3", "bfloat16", request.param)
    return target, {name: load_drafter(ASSETS / name, target) for name in DRAFTER_NAMES}


def test_speculation_is_lossless_against_the_quantized_target(quantized):
    target, drafters = quantized
    assert isinstance(target.lm_head, QuantizedLinear) and target.lm_head.scheme.startswith("int8_g32") and isinstance(target.layers[0].mlp.gate_up_proj, QuantizedLinear)
    assert isinstance(target.layers[0].self_attn.qkv_proj, QuantizedLinear)
    for name, drafter in drafters.items():          # the drafters run in their target's numerics too
        assert isinstance(drafter.fc, QuantizedLinear) == kernels.available(), name
        assert isinstance(drafter.layers[0].mlp.down_proj, QuantizedLinear) == kernels.available(), name
    for prompt in PROMPTS:
        ref = generate_one(target, prompt, SamplingParams(max_tokens=28, ignore_eos=True)).token_ids
        for name, drafter in drafters.items():
            gen = generate_one(target, prompt, SamplingParams(max_tokens=28, ignore_eos=True), drafter)
            assert gen.token_ids == ref, name


@pytest.mark.parametrize("scheme", ["int8", "int4", "int4-a8"])
def test_llm_quantized_engine_matches_its_own_plain_decoding(scheme):
    kw = dict(target=str(ASSETS / "target-qwen3"), dtype="bfloat16", quantization=scheme, max_batch=4)
    spec = LLM(drafter=str(ASSETS / "dspark"), adaptive_speculation=False, **kw)
    plain = LLM(drafter="none", **kw)
    assert spec.numerics["quantization"] == scheme
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    a = spec.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    b = plain.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


@pytest.mark.skipif(not kernels.available(), reason="no C compiler: int4-a8 cannot load")
def test_8bit_activations_are_another_model_close_to_int4():
    """int4-a8 changes only how the activations are rounded: every layer and the LM head carry 8-bit
    activations, the weights are int4's, and the logits stay close to int4's (not equal)."""
    a16 = load_target(ASSETS / "target-qwen3", "bfloat16", "int4")
    a8 = load_target(ASSETS / "target-qwen3", "bfloat16", "int4-a8")
    assert scheme_of(a8) == "int4-a8" and a8.lm_head.scheme == "int8_g32-a8" and a8.lm_head.act_bits == 8
    assert all(m.act_bits == 8 for m in a8.modules() if isinstance(m, QuantizedLinear))
    assert torch.equal(a8.layers[0].mlp.down_proj.qweight, a16.layers[0].mlp.down_proj.qweight)
    ids = torch.randint(0, a8.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        la8, la16 = a8.logits(ids).float(), a16.logits(ids).float()
    assert not torch.equal(la8, la16)
    assert F.cosine_similarity(la8.flatten(), la16.flatten(), dim=0) > 0.99


def test_8bit_activations_need_the_own_kernel():
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(6))
    with pytest.raises(ConfigError, match="quantization 'int4-a8': 8-bit activations run on blockdraft's own kernel"):
        QuantizedLinear(w, None, "int4-a8", "torch")


def test_bad_quantization_is_named():
    with pytest.raises(ConfigError, match="quantization 'int3' is not supported"):
        check_scheme("int3", torch.bfloat16)
    with pytest.raises(ConfigError, match="runs with bf16 activations; dtype is float32"):
        load_target(ASSETS / "target-qwen3", "float32", "int8")
    with pytest.raises(ConfigError, match="on cuda use quantization=none"):
        check_scheme("int4", torch.bfloat16, "cuda")


@pytest.mark.skipif(not kernels.available(), reason="no C compiler: the layers run unfused")
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_fused_layer_gives_the_unfused_bits(scheme):
    """The quantized layers in one kernel call a step (norms, q/k/v with Qwen3's q/k norms and the rotation,
    the cache write, attention, o_proj + residual, gate/up, SwiGLU, down + residual; taps copied out) equal
    their PyTorch spelling bit for bit:
    prefill, a multi-row step, batch 2, logits and taps."""
    target = load_target(ASSETS / "target-qwen3", "bfloat16", scheme)
    stack = target.fused
    assert stack is not None and stack.head is not None     # the final norm and LM head in the same call
    ids = torch.randint(0, target.config.vocab_size, (2, 23), generator=torch.Generator().manual_seed(5))
    outs = {}
    for fused in (True, False):
        target.fused = stack if fused else None
        with torch.inference_mode():
            cache = target.new_cache(2, 32)
            first, second = target(ids[:, :17], cache, (1, 3)), target(ids[:, 17:], cache, (1, 3))
        outs[fused] = (first.logits, first.taps, first.hidden, second.logits, second.taps, second.hidden,
                       cache.k[2][:, :, :23])
        if fused:                                            # the step's argmax, as argmax_ids gives it
            assert torch.equal(second.argmax, argmax_ids(second.logits)) and second.argmax.shape == (2, 6)
        else:
            assert second.argmax is None
    for a, b in zip(outs[True], outs[False]):
        assert torch.equal(a, b)


@pytest.mark.skipif(not kernels.available(), reason="no C compiler: the layers run unfused")
def test_the_fused_step_uses_the_head_the_model_holds():
    """A target whose LM head was replaced after quantization (a pruned or resharded head) gets that head's
    logits, not the stack's copy of the old one."""
    target = load_target(ASSETS / "target-qwen3", "bfloat16", "int4")
    ids = torch.randint(0, target.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(3))
    old = target.lm_head
    target.lm_head = QuantizedLinear(old.weight.flip(0), None, old.scheme, old.kernel)
    with torch.inference_mode():
        fused = target(ids, target.new_cache(1, 8)).logits
        target.fused = None
        unfused = target(ids, target.new_cache(1, 8)).logits
    assert torch.equal(fused, unfused)


@pytest.mark.skipif(not kernels.available(), reason="no C compiler: the layers run unfused")
def test_fused_layers_give_the_same_bits_on_every_instruction_set(monkeypatch):
    """Every kernel of the fused step (norms, q/k/v, Qwen3's q/k norms, the rotation, attention, SwiGLU, the
    matmuls, the final norm, LM head and argmax) gives the portable C's bits on this machine's instruction set:
    logits, their argmax, taps and the cache, on every path this CPU runs."""
    target = load_target(ASSETS / "target-qwen3", "bfloat16", "int4")
    ids = torch.randint(0, target.config.vocab_size, (2, 21), generator=torch.Generator().manual_seed(8))
    outs = {}
    for isa in runnable_isas():
        monkeypatch.setattr(kernels, "best_isa", lambda isa=isa: isa)
        with torch.inference_mode():
            cache = target.new_cache(2, 32)
            first, second = target(ids[:, :15], cache, (1, 3)), target(ids[:, 15:], cache, (1, 3))
        outs[isa] = (first.logits, first.taps, first.argmax, second.logits, second.taps, second.argmax,
                     cache.k[2][:, :, :21], cache.v[1])
    portable = outs.pop("portable")
    for isa, out in outs.items():
        assert all(torch.equal(a, b) for a, b in zip(portable, out)), isa


@pytest.mark.skipif(not kernels.available(), reason="no C compiler: the layers run unfused")
def test_fused_layers_write_and_read_the_paged_pool_in_place():
    """The engine's ragged paged batch: the fused layers write each real row's K/V at its slot (padding
    nowhere) and read the keys through the block tables, with the bits of the PyTorch spelling."""
    target = load_target(ASSETS / "target-qwen3", "bfloat16", "int4")
    cfg, stack = target.config, target.fused
    ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(6))
    tables = pad_tables([[3, 1, 5], [0, 2]])
    outs = {}
    for fused in (True, False):
        target.fused = stack if fused else None
        pool = PagedKVPool(list(range(cfg.num_layers)), 8, 4, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16)
        with torch.inference_mode():
            first = PagedStep(pool, tables, [0, 0], [9, 6])                     # ragged prefill: row 1 padded
            assert first.kernel_kv() is not None
            a = target(ids[:, :9], first, (1, 3))
            b = target(ids[:, 9:11], PagedStep(pool, tables, [9, 6], [2, 1]), (1, 3))
            one = PagedStep(pool, tables[:1], [11], [1])              # a decoding row: it sees every key
            assert one.kernel_kv().visible is None and one.visible.all()
            c = target(ids[:1, 11:], one, (1, 3))
            two = PagedStep(pool, tables, [7, 7], [1, 1])             # two decoding rows at one length
            assert two.kernel_kv().visible is None and two.visible.all()
            d = target(ids[:, 7:8], two, (1, 3))
        outs[fused] = (a.logits[0], a.logits[1, :6], a.taps[1, :6], b.logits[0], b.logits[1, :1], c.logits, c.taps,
                       d.logits, d.taps, pool.k[1], pool.v[2])
    for x, y in zip(outs[True], outs[False]):
        assert torch.equal(x, y)


@pytest.mark.skipif(not kernels.available(), reason="no C compiler")
@pytest.mark.parametrize("rows, width", [(5, 200), (1, 16390), (3, 8200)])
def test_swiglu_kernel_gives_the_same_bits_on_every_instruction_set_and_rounds_as_pytorch(rows, width):
    """Every path this machine runs (AVX2's 8 lanes, AVX512's 16, the scalar tail), on 1 and 3 threads (rows of
    16,384 elements or more split into chunks between threads), gives the portable path's bits."""
    g = torch.Generator().manual_seed(7)
    gate = (torch.randn(rows, width, generator=g) * torch.logspace(-3, 2, width)).bfloat16()
    gate[0, :5] = torch.tensor([0.0, -0.0, 100.0, -100.0, float("nan")])
    up = torch.randn(rows, width, generator=g).bfloat16()
    outs = {(isa, n): on_threads(n, lambda: kernels.swiglu(gate, up, isa)) for isa in runnable_isas() for n in (1, 3)}
    for key, out in outs.items():
        assert torch.equal(outs[("portable", 1)].view(torch.int16), out.view(torch.int16)), key
    ref = F.silu(gate.double()) * up.double()            # two bf16 roundings from the exact value
    torch.testing.assert_close(outs[("portable", 1)].double(), ref, rtol=2 ** -7, atol=1e-30, equal_nan=True)
    assert kernels.swiglu(gate.float(), up.float()) is None


@pytest.mark.parametrize("ci", [None, "true"])
def test_a_kernel_that_does_not_build_is_reported_and_fails_ci(tmp_path, ci):
    """Without a working compiler the kernel tests skip; pytest's summary says so, and under CI=true the
    run fails (tests/conftest.py). A broken $CC stands in for a machine without a compiler."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(CC=str(tmp_path / "no-such-cc"), BLOCKDRAFT_CACHE=str(tmp_path), **({"CI": ci} if ci else {}))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_llm_api.py::test_import_is_light"], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).parents[2], timeout=300)
    assert "blockdraft's CPU kernels did not build" in run.stdout, run.stdout[-2000:]
    assert (run.returncode != 0) == (ci == "true"), run.stdout[-2000:]


@pytest.mark.skipif(not kernels.available(), reason="no C compiler: the layers run unfused")
@pytest.mark.parametrize("point", ["hidden_states", "layer_output"])
def test_a_decoding_row_from_addresses_gives_the_steps_bits(point):
    """`fused_row` (the embedding's and rotary table's rows and the kept slots handed over as addresses) gives
    a one-row paged step's logits, argmax, taps (either tap point) and cache writes, bit for bit, across pages."""
    from blockdraft.cache.paged import SlotRow
    from blockdraft.config import Taps
    target = row_pass_target("int4")
    cfg = target.config
    taps = Taps((1, cfg.num_layers - 1), point)
    ids = torch.randint(0, cfg.vocab_size, (1, 19), generator=torch.Generator().manual_seed(2)).tolist()[0]
    table = [5, 2, 7, 0, 3, 6]
    outs = {}
    for by_row in (True, False):
        pool = PagedKVPool(list(range(cfg.num_layers)), 8, 4, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16)
        row, got = SlotRow(4), []
        with torch.inference_mode():
            target(torch.tensor([ids[:6]]), PagedStep(pool, pad_tables([table]), [0], [6]))
            for p in range(6, len(ids)):
                if by_row:
                    row.sync(table, p + 1)
                    out = target.fused_row(ids[p], p, pool.row_kv(row, p), taps)
                else:
                    out = target(torch.tensor([[ids[p]]]), PagedStep(pool, pad_tables([table]), [p], [1]), taps)
                got.append((out.logits.clone(), out.argmax.clone(), out.taps, out.hidden.clone()))
        outs[by_row] = (got, pool.k[1].clone(), pool.v[3].clone())
    for (a, b) in zip(outs[True][0], outs[False][0]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(outs[True][1], outs[False][1]) and torch.equal(outs[True][2], outs[False][2])


def one_row():
    """A row-pass target, a pool for it and the kept slots of a row at position 0 of block 1 (the kernel's view
    of them, `pool.row_kv(row, 0)`, holds their addresses: keep both)."""
    from blockdraft.cache.paged import SlotRow
    target = row_pass_target("int4")
    cfg = target.config
    pool = PagedKVPool(list(range(cfg.num_layers)), 8, 4, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16)
    row = SlotRow(4)
    row.sync([1], 1)
    return target, pool, row


@pytest.mark.skipif(not kernels.available(), reason="no C compiler: the layers run unfused")
def test_a_decoding_row_needs_the_whole_model_in_the_fused_step():
    """fused_row declines (None) where the stack does not hold the model's head, or its heads are not a multiple
    of 32 wide (no rotary table); an id outside the embedding is refused by name before any work."""
    target, pool, row = one_row()
    cfg, kv = target.config, pool.row_kv(row, 0)
    with torch.inference_mode():
        assert target.fused_row(3, 0, kv) is not None
        with pytest.raises(ValueError, match=f"token id {cfg.vocab_size}"):
            target.fused_row(cfg.vocab_size, 0, kv)
        old = target.lm_head
        target.lm_head = QuantizedLinear(old.weight.flip(0), None, old.scheme, old.kernel)
        assert target.fused_row(3, 0, kv) is None
        narrow = load_target(ASSETS / "target-qwen3", "bfloat16", "int4")       # 16-wide heads
        assert narrow.fused is not None and narrow.fused_row(3, 0, kv) is None


@pytest.mark.skipif(not kernels.available(), reason="no C compiler: the layers run unfused")
def test_decoding_rows_in_two_threads_keep_their_own_outputs():
    """The address pass's outputs are the stack's own per calling thread: one thread's next row does not
    overwrite what another thread's row returned."""
    import threading
    target, pool, row = one_row()
    kv = pool.row_kv(row, 0)
    with torch.inference_mode():
        mine = target.fused_row(3, 0, kv)
        kept = mine.logits.clone()
        other = []

        @torch.inference_mode()
        def decode_elsewhere():
            other.append(target.fused_row(5, 0, kv))

        worker = threading.Thread(target=decode_elsewhere)
        worker.start()
        worker.join()
    assert other[0].logits.data_ptr() != mine.logits.data_ptr() and torch.equal(mine.logits, kept)
