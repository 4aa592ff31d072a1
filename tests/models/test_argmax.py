"""The last-dimension argmax kernel (`cpu_kernels.argmax`, which `vocab.argmax_ids` runs on AVX512 CPUs): torch's
index on every instruction set this CPU runs — ties to the lowest index, a row's first NaN, all -inf — for
bf16 and fp32 rows of every length around the vector width, strided views, and the shapes decoding uses."""

import pytest
import torch

from blockdraft.layers import cpu_kernels as kernels
from blockdraft.layers.vocab import argmax_ids
from conftest import runnable_isas

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C compiler: torch's argmax runs")


def hard_rows(n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """[6, n]: random, few distinct values (ties), NaNs, all -inf, -inf with a late NaN, a late maximum"""
    x = torch.randn(6, n, generator=g)
    x[1] = torch.randint(-2, 3, (n,), generator=g).float()
    x[2, torch.randint(0, n, (2,), generator=g)] = float("nan")
    x[3] = float("-inf")
    x[4] = float("-inf")
    x[4, -1] = float("nan")
    x[5, -1] = 100.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 31, 32, 33, 47, 1000, 49152, 65539])
def test_every_isa_gives_torch_argmax(n, dtype):
    g = torch.Generator().manual_seed(n)
    x = hard_rows(n, dtype, g)
    want = x.argmax(-1)
    for isa in runnable_isas():
        assert torch.equal(kernels.argmax(x, isa), want), isa


def test_shapes_strides_and_fallbacks():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 9, 4099, generator=g).bfloat16()                  # [batch, rows, vocab]
    assert torch.equal(argmax_ids(logits), logits.argmax(-1))
    assert argmax_ids(logits).shape == (2, 9)
    for view in (logits[:, ::2], logits[..., ::3], logits.transpose(0, 1), logits[0, 3]):
        assert torch.equal(kernels.argmax(view, kernels.best_isa()), view.argmax(-1))
    assert kernels.argmax(logits.half()) is None                              # torch's for other dtypes
    assert kernels.argmax(torch.empty(3, 0)) is None
    assert torch.equal(argmax_ids(logits.half()), logits.half().argmax(-1))
    grad = torch.randn(3, 40, requires_grad=True)
    assert kernels.argmax(grad) is None and torch.equal(argmax_ids(grad), grad.argmax(-1))
