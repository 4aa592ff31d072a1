"""Packed weights on 2 MiB pages: what a memory-bound decoding step reads, with fewer TLB misses.

A one-row int4 step streams every weight once; on 4 KiB pages that is a page walk every 4 KiB and a
hardware prefetcher that stops at each page boundary. Linux backs anonymous memory with transparent huge
pages where the process asks for them (`madvise(MADV_HUGEPAGE)`, the default `madvise` setting) or
everywhere (`always`). `weight_buffer` copies a packed weight into fresh anonymous memory whose whole
2 MiB pages are advised before the first write, so the kernel can fault them in as huge pages. The bytes
are the same, only their pages differ: the matmul's results do not change.

Weights under 2 MiB stay where they are (they fill no whole huge page). `BLOCKDRAFT_HUGEPAGES=0` turns
it off; off Linux, or where the kernel refuses the advice, the copy is skipped.
"""

from __future__ import annotations

import mmap
import os

import torch

HUGE_PAGE = 2 << 20
ENABLED = os.environ.get("BLOCKDRAFT_HUGEPAGES", "1") != "0"


def weight_buffer(src: torch.Tensor) -> torch.Tensor:
    """`src` (contiguous, CPU), or a copy of it on memory advised for 2 MiB pages where that applies:
    at least one whole huge page of bytes, Linux's MADV_HUGEPAGE, `ENABLED`. The copy keeps its mapping
    alive and returns it to the system when the last tensor on it is freed."""
    nbytes = src.numel() * src.element_size()
    if not ENABLED or nbytes < HUGE_PAGE or src.device.type != "cpu" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return src
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE)     # anonymous, untouched
    raw = torch.frombuffer(mapping, dtype=torch.uint8)                       # holds `mapping` alive
    start = -raw.data_ptr() % HUGE_PAGE                                      # the first 2 MiB boundary
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE, start, nbytes // HUGE_PAGE * HUGE_PAGE)   # whole pages only
    except OSError:                  # THP compiled out or refused: the weight stays where it is
        return src
    out = raw[start:start + nbytes].view(src.dtype).view(src.shape)
    out.copy_(src)
    return out
