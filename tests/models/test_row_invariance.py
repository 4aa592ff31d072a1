"""bf16 rows round the same whatever else shares the pass: the basis of lossless bf16 speculation.

A verify pass over `[anchor, d_1..d_k]` (and a request batched beside others) must produce,
row for row, the bits a one-row decoding step produces. Checked here, bitwise, on the machine
the suite runs on: the linear layer at every row count, attention at every query count and
key length, and the real default model (SmolLM2) whose plain bf16 kernels do not have this
property (its 9-row pass differed from one-row steps by up to 0.56 in a logit).
"""

import pytest
import torch
from torch.nn import functional as F

from blockdraft.cache.views import causal_visibility
from blockdraft.layers.attention import attend
from blockdraft.layers.linear import stable_linear
from conftest import on_threads, runnable_isas


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(192, 576), (1536, 576), (576, 1536), (576, 1152), (4096, 576)])
def test_linear_rows_independent_of_row_count(shape, bias):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(shape, generator=g) * 0.05).bfloat16()
    b = torch.randn(shape[0], generator=g).bfloat16() if bias else None
    x = torch.randn(80, shape[1], generator=g).bfloat16()
    one = torch.cat([stable_linear(x[i:i + 1], w, b) for i in range(80)])
    for rows in (2, 9, 16, 17, 33, 72, 80):
        assert torch.equal(stable_linear(x[:rows], w, b), one[:rows]), rows


def test_sliced_weights_follow_in_place_writes():
    """The cached weight slices of a cut reduction are remade when the weight is written in place."""
    from blockdraft.layers.linear import _sliced

    w = torch.randn(64, 1536).bfloat16()
    x = torch.randn(3, 1536).bfloat16()
    before = _sliced(x, w, None, 2)
    w.mul_(2)
    assert torch.equal(_sliced(x, w, None, 2), (before.float() * 2).bfloat16())


def test_attention_rows_independent_of_queries_and_keys():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 9, 20, 64, generator=g).bfloat16()
    k = torch.randn(2, 3, 300, 64, generator=g).bfloat16()
    v = torch.randn(2, 3, 300, 64, generator=g).bfloat16()
    for start in (5, 100, 250):
        q_pos = torch.arange(start, start + 20).expand(2, 20)
        keys = start + 20
        many = attend(q, k[:, :, :keys], v[:, :, :keys], causal_visibility(q_pos, torch.arange(keys).expand(2, keys)),
                      0.125)
        for i in (0, 7, 19):
            n = start + i + 1
            for extra in (0, 13):       # masked keys past the row's own must not change its bits
                kp = torch.arange(n + extra).expand(2, n + extra)
                one = attend(q[:, :, i:i + 1], k[:, :, :n + extra], v[:, :, :n + extra],
                             causal_visibility(q_pos[:, i:i + 1], kp), 0.125)
                assert torch.equal(one[:, 0], many[:, i]), (start, i, extra)


@pytest.mark.parametrize("tq, tk", [(7, 11), (300, 300)])      # 300 query rows: chunked passes
def test_attention_still_matches_sdpa(tq, tk):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 4, tq, 16, generator=g), torch.randn(1, 2, tk, 16, generator=g),
               torch.randn(1, 2, tk, 16, generator=g))
    vis = causal_visibility(torch.arange(tk - tq, tk)[None], torch.arange(tk)[None])
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=vis, scale=0.25, enable_gqa=True)
    assert torch.allclose(attend(q, k, v, vis, 0.25), ref.transpose(1, 2).reshape(1, tq, 64), atol=1e-5)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    whole = attend(qb, kb, vb, vis, 0.25)
    assert torch.equal(attend(qb[:, :, -3:], kb, vb, vis[:, :, -3:], 0.25), whole[:, -3:])


@pytest.mark.parametrize("h, hkv, d", [(6, 2, 32), (8, 2, 48), (5, 5, 16), (8, 1, 64)])
def test_cpu_attention_kernel_same_bits_on_every_instruction_set(h, hkv, d):
    """The own kernel's AVX2 spelling (query heads of a KV head together, 4 keys at a time) and the
    portable one (a head at a time) give the same bits, on 1 and 2 threads, close to the float64 form;
    a row that sees no key gives zeros."""
    from blockdraft.layers import cpu_kernels as kernels
    from blockdraft.layers.attention import _row_stable

    assert kernels.attention_fits(torch.zeros(1, 1, 1, 64).bfloat16(), torch.zeros(1, 1, 1, 64).bfloat16())
    g = torch.Generator().manual_seed(4)
    q = (torch.randn(2, h, 5, d, generator=g) * 3).bfloat16()
    k = (torch.randn(2, hkv, 90, d, generator=g) * 3).bfloat16()
    v = torch.randn(2, hkv, 90, d, generator=g).bfloat16()
    vis = causal_visibility(torch.tensor([[40, 41, 42, 43, 44], [80, 81, 82, 83, 84]]),
                            torch.arange(90).expand(2, 90))
    vis[1, 0, 2] = False                                              # a row that sees nothing
    outs = {isa: kernels.attend(q, k, v, vis, 0.2, isa) for isa in runnable_isas()}
    outs["2 threads"] = on_threads(2, lambda: kernels.attend(q, k, v, vis, 0.2))
    for isa in outs:
        assert torch.equal(outs[isa], outs["portable"]), isa
    assert torch.equal(outs["portable"][1, 2], torch.zeros(h * d).bfloat16())
    ref = _row_stable(q, k, v, vis, 0.2, h // hkv).transpose(1, 2).reshape(2, 5, h * d)
    torch.testing.assert_close(outs["portable"].float(), ref.float(), atol=0.02, rtol=0.02)


@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_attention_kernel_rows_together_same_bits_as_one_at_a_time(threads):
    """Where the kernel takes a verify pass's query rows together (AVX512: each key read once for every row
    that sees it), rows that see different keys (a sliding window, keys no row sees, a row that sees
    none) give the bits of the portable spelling, which takes one row and head at a time."""
    from blockdraft.layers import cpu_kernels as kernels

    g = torch.Generator().manual_seed(6)
    q = (torch.randn(1, 9, 20, 64, generator=g) * 3).bfloat16()
    k = (torch.randn(1, 3, 300, 64, generator=g) * 3).bfloat16()
    v = torch.randn(1, 3, 300, 64, generator=g).bfloat16()
    q_pos = torch.arange(260, 280)[None]
    vis = causal_visibility(q_pos, torch.arange(300)[None], window=50)
    vis[0, 0, 3] = False                                              # a row that sees nothing
    vis[0, 0, :, 250] = False                                         # a key inside the window no row sees
    outs = on_threads(threads, lambda: {isa: kernels.attend(q, k, v, vis, 0.2, isa) for isa in runnable_isas()})
    for isa, out in outs.items():
        assert torch.equal(out.view(torch.int16), outs["portable"].view(torch.int16)), isa
    assert torch.equal(outs["portable"][0, 3], torch.zeros(9 * 64).bfloat16())


def test_cpu_rms_norm_kernel_rows_alone_and_close_to_the_formula():
    """The own RMSNorm (bf16 inference on the CPU) computes each row on its own, with the same bits on every
    instruction set and thread count (a NaN row included), within a bf16 rounding of Llama's fp32 formula; a weight being
    trained runs the formula itself (autograd)."""
    from blockdraft.layers import cpu_kernels
    from blockdraft.layers.norm import RMSNorm

    norm = RMSNorm(576, 1e-5)
    norm.weight.data = (torch.rand(576) + 0.5).bfloat16()
    x = (torch.randn(40, 576) * torch.logspace(-3, 3, 576)).bfloat16()
    with torch.no_grad():
        assert cpu_kernels.rms_norm(x, norm.weight, 1e-5) is not None
        odd = torch.cat([x, torch.full((1, 576), float("nan")).bfloat16()])
        outs = {(isa, n): on_threads(n, lambda: cpu_kernels.rms_norm(odd, norm.weight, 1e-5, isa))
                for isa in runnable_isas() for n in (1, 3)}            # 41 rows of 576: split between threads
        for key, got in outs.items():
            assert torch.equal(outs[("portable", 1)].view(torch.int16), got.view(torch.int16)), key
        out = norm(x)
        assert torch.equal(torch.cat([norm(x[i:i + 1]) for i in range(40)]), out)
        x32 = x.float()
        ref = norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2 ** -7, atol=0)
    assert cpu_kernels.rms_norm(x, norm.weight, 1e-5) is None and norm(x).requires_grad


@pytest.fixture(scope="module")
def smollm2_bf16():
    from blockdraft.default_model import smollm2_dir
    from blockdraft.loading import load_target

    return load_target(smollm2_dir(), "bfloat16")


@torch.inference_mode()
def test_default_model_verify_rows_equal_one_row_steps(smollm2_bf16):
    t = smollm2_bf16
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, t.config.vocab_size, (1, 37), generator=g)
    block = torch.randint(0, t.config.vocab_size, (1, 9), generator=g)
    cache = t.new_cache(1, 64)
    t(prompt, cache)
    cache.truncate(37)
    many = t(block, cache).logits[0]                                # [9, vocab]
    for i in range(9):
        cache.truncate(37 + i)
        one = t(block[:, i:i + 1], cache).logits[0, 0]
        assert torch.equal(one, many[i]), f"row {i}: max |diff| {(one.float() - many[i].float()).abs().max()}"


def test_numerics_auto_and_cpu_flags():
    from blockdraft.errors import ConfigError
    from blockdraft.numerics import describe, native_bf16, resolve_dtype

    assert native_bf16(frozenset({"avx2", "amx_bf16"})) and native_bf16(frozenset({"avx512_bf16"}))
    assert not native_bf16(frozenset({"avx2", "fma", "avx512f"}))
    assert resolve_dtype("auto", default_model=True) == "bfloat16"       # the row-invariant numerics
    assert resolve_dtype(None, default_model=False) == "float32"
    assert resolve_dtype("auto", device="cuda:0") == "bfloat16"
    assert resolve_dtype("float32", default_model=True) == "float32"
    with pytest.raises(ConfigError, match="dtype 'fp8' is not supported"):
        resolve_dtype("fp8")
    assert describe("bfloat16")["row_invariant"] and not describe("float32")["row_invariant"]


def test_numerics_report_row_invariance_per_device():
    """Only the CPU's bf16 kernels are row-invariant: CUDA's bf16 GEMMs and attention pick kernels by shape."""
    from blockdraft.numerics import describe

    assert describe("bfloat16", device="cpu")["row_invariant"]
    assert describe("bfloat16", "int4", "cpu_kernels", device="cpu")["row_invariant"]
    cuda = describe("bfloat16", device="cuda:0")
    assert cuda["row_invariant"] is False and cuda["device"] == "cuda:0"
    assert not describe("float32", device="cuda")["row_invariant"]
