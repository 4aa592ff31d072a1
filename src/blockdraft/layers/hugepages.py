"""Packed weights on 2 MiB pages: what a memory-bound decoding step reads, with fewer TLB misses.

A one-row int4 step streams every weight once; on 4 KiB pages that is a page walk every 4 KiB and a
hardware prefetcher that stops at each page boundary. Linux backs anonymous memory with transparent huge
pages where the process asks for them (`madvise(MADV_HUGEPAGE)`, the default `madvise` setting) or
everywhere (`always`). `weight_buffer` copies a packed weight into fresh anonymous memory whose whole
2 MiB pages are advised before the first write, so the kernel can fault them in as huge pages. The bytes
are the same, only their pages differ: the matmul's results do not change.

Weights under 2 MiB are packed one after another into shared 32 MiB slabs, so that a model of many small
layers streams whole huge pages too. `BLOCKDRAFT_HUGEPAGES=0` turns it off; off Linux, or where the kernel
refuses the advice, the copy is skipped.
"""

from __future__ import annotations

import mmap
import os
import weakref
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
SLAB = 16 * HUGE_PAGE       # weights under a huge page share slabs of this size, one after another
ALIGN = 64                  # each weight's first byte on a cache line
ENABLED = os.environ.get("BLOCKDRAFT_HUGEPAGES", "1") != "0"

_slab: list = [None, 0, 0]   # a weak reference to the newest weight in the newest slab, its next free byte, its end
_refused: list = []          # holds True once the system refused the advice: later weights are not copied


def _advised(nbytes: int) -> tuple[torch.Tensor, int] | None:
    """(a uint8 tensor over fresh anonymous memory, the offset of its first 2 MiB boundary), nbytes from there
    on with their whole huge pages advised; None where the system refuses the advice. The tensor, and every
    view of it, keeps the mapping alive."""
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE)     # anonymous, untouched
    raw = torch.frombuffer(mapping, dtype=torch.uint8)                       # holds `mapping` alive
    start = -raw.data_ptr() % HUGE_PAGE
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE, start, nbytes // HUGE_PAGE * HUGE_PAGE)   # whole pages only
    except OSError:                  # THP compiled out or refused: it will be for every weight
        _refused.append(True)
        return None
    return raw, start


def _place(nbytes: int) -> tuple[torch.Tensor, bool] | None:
    """(nbytes of advised memory, whether they are in a slab); None where the system refuses the advice.
    A small weight goes into the newest slab while it has room and its newest weight lives."""
    if nbytes >= HUGE_PAGE:
        made = _advised(nbytes)
        return None if made is None else (made[0][made[1]:made[1] + nbytes], False)
    newest = _slab[0]() if _slab[0] is not None else None
    at, end = _slab[1], _slab[2]
    if newest is None or at + nbytes > end:
        made = _advised(SLAB)
        if made is None:
            return None
        root, at = made
        end = at + SLAB
    else:
        root = torch.empty(0, dtype=torch.uint8).set_(newest.untyped_storage())     # the slab's whole mapping
    _slab[1:] = [-(-(at + nbytes) // ALIGN) * ALIGN, end]
    return root[at:at + nbytes], True


def weight_buffer(src: torch.Tensor) -> torch.Tensor:
    """`src` (contiguous, CPU), or a copy of it on memory advised for 2 MiB pages where that applies
    (Linux's MADV_HUGEPAGE, `ENABLED`): a weight of a huge page or more on a mapping of its own, smaller ones
    one after another in shared slabs so that they fill whole huge pages too. Memory goes back to the system
    when the last weight on it is freed."""
    nbytes = src.numel() * src.element_size()
    if not ENABLED or _refused or nbytes == 0 or src.device.type != "cpu" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return src
    placed = _place(nbytes)
    if placed is None:
        return src
    out = placed[0].view(src.dtype).view(src.shape)
    out.copy_(src)
    if placed[1]:
        _slab[0] = weakref.ref(out)
    return out


def mapping_fields(field: str) -> dict[tuple[int, int], int]:
    """{(first, end) address of each of this process's mappings: its `field` in /proc/self/smaps (in kB for the
    sizes, e.g. AnonHugePages; 0 or 1 for THPeligible)}."""
    out, span = {}, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5:
            span = tuple(int(x, 16) for x in head[0].split("-"))
        elif head[0] == f"{field}:" and span is not None:
            out[span] = int(head[1])
    return out
