"""Packed weights on 2 MiB pages: the same bytes and the same products, on memory the kernel may back with
transparent huge pages."""

import gc
import mmap
import types
from pathlib import Path

import pytest
import torch

from blockdraft.layers import cpu_kernels as kernels
from blockdraft.layers import hugepages
from blockdraft.layers.quant import QuantizedLinear

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE") or not THP.exists()
                               or "[never]" in THP.read_text(), reason="no transparent huge pages on this system")


def mapping_field(address: int, field: str) -> int:
    """`field` of the /proc/self/smaps entry whose mapping holds `address`."""
    value = next((v for (lo, hi), v in hugepages.mapping_fields(field).items() if lo <= address < hi), None)
    assert value is not None, f"no {field} for the mapping at {address:#x}"
    return value


@needs_thp
def test_a_large_weight_is_copied_onto_advised_2mib_pages():
    src = torch.randint(0, 256, (5 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = hugepages.weight_buffer(src)
    assert out.data_ptr() != src.data_ptr() and out.data_ptr() % hugepages.HUGE_PAGE == 0
    assert out.dtype == src.dtype and out.shape == src.shape and torch.equal(out, src)
    assert mapping_field(out.data_ptr(), "THPeligible") == 1
    total = int(src.sum())
    del src
    gc.collect()                    # the tensor alone keeps its mapping alive
    assert int(out.sum()) == total


@needs_thp
def test_small_weights_share_slabs_on_advised_pages():
    g = torch.Generator().manual_seed(2)
    srcs = [torch.randint(-99, 99, (n,), dtype=torch.int16, generator=g) for n in (1000, 333, 70_000)]
    outs = [hugepages.weight_buffer(s) for s in srcs]
    assert all(torch.equal(o, s) and o.data_ptr() != s.data_ptr() for o, s in zip(outs, srcs))
    assert len({o.untyped_storage().data_ptr() for o in outs}) == 1                  # one slab
    assert all(o.data_ptr() % hugepages.ALIGN == 0 for o in outs)
    ends = sorted((o.data_ptr(), o.data_ptr() + 2 * o.numel()) for o in outs)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ends, ends[1:]))  # no two overlap
    assert mapping_field(outs[0].data_ptr(), "THPeligible") == 1
    del outs[:2]
    gc.collect()
    later = hugepages.weight_buffer(srcs[0])          # the slab lives on with its last weight
    assert later.untyped_storage().data_ptr() == outs[0].untyped_storage().data_ptr()
    assert torch.equal(outs[0], srcs[2]) and torch.equal(later, srcs[0])


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE on this system")
def test_a_refused_advice_leaves_weights_where_they_are_and_is_not_asked_again(monkeypatch):
    made = []

    class Refusing(mmap.mmap):
        def madvise(self, *args):
            made.append(self)
            raise OSError(22, "Invalid argument")

    monkeypatch.setattr(hugepages, "mmap", types.SimpleNamespace(mmap=Refusing, MAP_PRIVATE=mmap.MAP_PRIVATE,
                                                                 MADV_HUGEPAGE=mmap.MADV_HUGEPAGE))
    monkeypatch.setattr(hugepages, "_refused", [])
    monkeypatch.setattr(hugepages, "_slab", [None, 0, 0])
    small, large = torch.ones(100, dtype=torch.uint8), torch.ones(3 * hugepages.HUGE_PAGE, dtype=torch.uint8)
    assert hugepages.weight_buffer(small) is small
    assert hugepages.weight_buffer(large) is large and hugepages.weight_buffer(small) is small
    assert len(made) == 1


def test_the_switch_leaves_the_tensor_where_it_is(monkeypatch):
    monkeypatch.setattr(hugepages, "ENABLED", False)
    for n in (100, 3 * hugepages.HUGE_PAGE):
        weight = torch.zeros(n, dtype=torch.uint8)
        assert hugepages.weight_buffer(weight) is weight


@pytest.mark.skipif(not kernels.available(), reason="the own kernel does not build here")
@pytest.mark.parametrize("scheme", ["int4", "int8", "int4-a8"])
def test_a_layer_on_huge_pages_gives_the_same_bits(scheme, monkeypatch):
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(4096, 1024, generator=g) * 0.05            # 2 MiB of int4, 4 MiB of int8
    x = torch.randn(9, 1024, generator=g).bfloat16()
    moved = hugepages.ENABLED and hasattr(mmap, "MADV_HUGEPAGE")
    on = QuantizedLinear(weight, None, scheme)
    monkeypatch.setattr(hugepages, "ENABLED", False)
    off = QuantizedLinear(weight, None, scheme)
    assert on.kernel == off.kernel == "qgemm"
    assert torch.equal(on.qweight, off.qweight) and torch.equal(on.scales, off.scales)
    if moved:
        assert on.qweight.data_ptr() % hugepages.HUGE_PAGE == 0       # the packed weight was moved
    assert torch.equal(on(x), off(x))
