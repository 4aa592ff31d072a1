"""DSpark's Markov bias kernel (`cpu_kernels.markov_bias`): the same bits on every instruction set this CPU
runs, at any row and thread count; PyTorch's fp32 matmul to rounding; and the head uses it only where it
applies (bf16 inference on the CPU), keeping autograd's path for training."""

import pytest
import torch
from torch.nn import functional as F

from blockdraft.drafters.dspark import MarkovHead
from blockdraft.layers import cpu_kernels as kernels
from conftest import on_threads, runnable_isas

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C compiler: the head runs PyTorch's matmul")


def assert_within_fp32_rounding(out: torch.Tensor, e: torch.Tensor, w: torch.Tensor) -> None:
    """out against PyTorch's fp32 e @ w.T: any order of rank fp32 multiply-adds lies within
    rank * 2^-23 of the sum of the terms' magnitudes."""
    bound = e.shape[-1] * 2.0 ** -23 * F.linear(e.abs(), w.float().abs())
    assert ((out - F.linear(e, w.float())).abs() <= bound).all()


@pytest.mark.parametrize("vocab,rank", [(1000, 48), (12288, 64), (4099, 128), (8200, 128)])   # the last: 2 MiB pages
def test_every_isa_gives_the_portable_bits_at_any_row_count(vocab, rank):
    g = torch.Generator().manual_seed(vocab)
    w = (torch.randn(vocab, rank, generator=g) * torch.exp2(torch.randint(-4, 5, (vocab, 1), generator=g))).bfloat16()
    e = torch.randn(9, rank, generator=g)
    portable = kernels.markov_bias(e, w, "portable")
    assert portable.shape == (9, vocab)
    assert_within_fp32_rounding(portable, e, w)
    for isa in runnable_isas():
        assert torch.equal(kernels.markov_bias(e, w, isa), portable), isa
        for rows in (1, 2, 5):
            assert torch.equal(kernels.markov_bias(e[:rows], w, isa), portable[:rows]), (isa, rows)


def test_thread_count_does_not_change_the_bits():
    g = torch.Generator().manual_seed(1)
    w, e = torch.randn(5000, 64, generator=g).bfloat16(), torch.randn(3, 64, generator=g)
    one = on_threads(1, lambda: kernels.markov_bias(e, w))
    assert torch.equal(on_threads(2, lambda: kernels.markov_bias(e, w)), one)


def test_the_head_runs_the_kernel_in_bf16_inference_and_autograd_in_training():
    head = MarkovHead(300, 32)
    with torch.no_grad():
        head.markov_w1.weight.normal_()
        head.markov_w2.weight.normal_()
    prev = torch.tensor([[3, 7], [299, 0]])
    fp32_bias, _ = head(prev)
    head.bfloat16()
    with torch.inference_mode():
        bias, embed = head(prev)                                       # [2, 2, 300]
        assert torch.equal(bias, kernels.markov_bias(embed.float(), head.markov_w2.weight))
    assert_within_fp32_rounding(bias, embed.float(), head.markov_w2.weight)
    torch.testing.assert_close(bias, fp32_bias, rtol=2e-2, atol=5e-2)          # the bf16 weights' rounding
    bias, _ = head(prev)                                               # weights that train: autograd's matmul
    bias.sum().backward()
    assert head.markov_w2.weight.grad is not None and head.markov_w2.weight.grad.abs().sum() > 0


def scored_rows(vocab: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """[6, vocab] logits: random, few distinct values (ties once the bias is 0), NaNs, all -inf, a late maximum,
    a NaN in the last block"""
    x = torch.randn(6, vocab, generator=g) * 4
    x[1] = torch.randint(-2, 3, (vocab,), generator=g).float()
    x[2, torch.randint(0, vocab, (2,), generator=g)] = float("nan")
    x[3] = float("-inf")
    x[4, -1] = 1e4
    x[5, -1] = float("nan")
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab,rank", [(5, 8), (200, 16), (4099, 64), (65536, 32)])
def test_one_pass_greedy_step_picks_the_index_of_bias_add_and_argmax(vocab, rank, dtype):
    g = torch.Generator().manual_seed(vocab + rank)
    w = torch.randn(vocab, rank, generator=g).bfloat16()
    e = torch.randn(6, rank, generator=g)
    e[1] = 0.0                                                    # a zero bias: the logits' ties decide
    logits = scored_rows(vocab, dtype, g)
    want = (logits.float() + kernels.markov_bias(e, w, "portable")).argmax(-1)
    for isa in runnable_isas():
        assert torch.equal(kernels.markov_argmax(e, w, logits, isa), want), isa
        assert torch.equal(kernels.markov_argmax(e[2:4], w, logits[2:4], isa), want[2:4]), isa
    wide = torch.zeros(6, 3, vocab, dtype=dtype)
    wide[:, 1] = logits                                           # a chain's slot: rows 3 * vocab apart
    assert torch.equal(kernels.markov_argmax(e, w, wide[:, 1]), want)
    assert torch.equal(on_threads(1, lambda: kernels.markov_argmax(e, w, logits)), want)
    assert torch.equal(on_threads(2, lambda: kernels.markov_argmax(e, w, logits)), want)


def test_greedy_chain_takes_the_one_pass_step_and_picks_what_the_bias_gives():
    from blockdraft.drafters.dspark import greedy_chain

    head = MarkovHead(3000, 16)
    with torch.no_grad():
        head.markov_w1.weight.normal_()
        head.markov_w2.weight.normal_(std=3.0)
    head.bfloat16()
    logits = torch.randn(2, 5, 3000, generator=torch.Generator().manual_seed(0)).bfloat16()
    anchor = torch.tensor([4, 2999])
    with torch.inference_mode():
        chain = greedy_chain(logits, anchor, head)
        prev, want = anchor, []
        for i in range(5):                                        # bias, sum and argmax apart
            bias, _ = head(prev)
            prev = (logits[:, i].float() + bias).argmax(-1)
            want.append(prev)
        assert torch.equal(chain, torch.stack(want, 1))
        calls = []
        real = kernels.markov_argmax
        kernels.markov_argmax = lambda *a, **k: calls.append(1) or real(*a, **k)
        try:
            greedy_chain(logits, anchor, head)
        finally:
            kernels.markov_argmax = real
        assert len(calls) == 5
