"""DSpark's Markov bias kernel (`cpu_kernels.markov_bias`): the same bits on every instruction set this CPU
runs, at any row and thread count; PyTorch's fp32 matmul to rounding; and the head uses it only where it
applies (bf16 inference on the CPU), keeping autograd's path for training."""

import pytest
import torch
from torch.nn import functional as F

from blockdraft.drafters.dspark import MarkovHead
from blockdraft.layers import cpu_kernels as kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C compiler: the head runs PyTorch's matmul")


def assert_within_fp32_rounding(out: torch.Tensor, e: torch.Tensor, w: torch.Tensor) -> None:
    """out against PyTorch's fp32 e @ w.T: any order of rank fp32 multiply-adds lies within
    rank * 2^-23 of the sum of the terms' magnitudes."""
    bound = e.shape[-1] * 2.0 ** -23 * F.linear(e.abs(), w.float().abs())
    assert ((out - F.linear(e, w.float())).abs() <= bound).all()


def runnable_isas() -> list[str]:
    best = kernels.ISAS[kernels.best_isa()]
    return [isa for isa, code in kernels.ISAS.items() if code <= best]


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
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernels.markov_bias(e, w)
        torch.set_num_threads(2)
        assert torch.equal(kernels.markov_bias(e, w), one)
    finally:
        torch.set_num_threads(threads)


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
