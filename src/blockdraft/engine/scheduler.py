"""Admission, capacity per step, preemption. Bookkeeping only: no model math here.

Each step every decoding sequence needs slots for `anchor + n drafts` (k + 1 new
positions, not one). Sequences are served oldest first; when the pool runs dry
the youngest running sequence is preempted (its blocks freed, its tokens kept)
and recomputed later, which leaves its output unchanged.
"""

from __future__ import annotations

from collections import deque

from ..cache.block_manager import BlockManager
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, blocks: BlockManager, max_batch: int, lookahead: int, prefill_chunk: int, ring=None):
        self.blocks, self.max_batch, self.ring = blocks, max_batch, ring
        self.lookahead, self.prefill_chunk = lookahead, prefill_chunk
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def drafts_for(self, seq: Sequence) -> int:
        """Drafts this step: never past the token budget."""
        start = len(seq.tokens) - 1
        return max(0, min(self.lookahead, seq.max_length - start - 1))

    def schedule(self) -> tuple[list[Sequence], list[Sequence]]:
        """Returns (sequences to prefill a chunk of, sequences to decode) for this step."""
        decode = []
        for seq in sorted((s for s in self.running if s.status is Status.DECODE), key=lambda s: s.order):
            if seq not in self.running:
                continue  # preempted while making room for an older one
            need = len(seq.tokens) + self.drafts_for(seq)
            while not self.blocks.allocate(seq.block_table, need):
                victim = max(self.running, key=lambda s: s.order)
                self.preempt(victim)
                if victim is seq:
                    break
            if seq in self.running:
                decode.append(seq)
        self._admit()
        prefill = [s for s in self.running if s.status is Status.PREFILL]
        return prefill, decode

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            hits = self.blocks.match_prefix(seq.tokens[: seq.prefill_end - 1])
            if not self.blocks.allocate(seq.block_table, len(seq.tokens) + self.lookahead, hits):
                break
            self.waiting.popleft()
            seq.num_computed = seq.num_drafter_ctx = len(hits) * self.blocks.block_size
            if not seq.generated:
                seq.num_cached_tokens = seq.num_computed
            seq.status = Status.PREFILL
            if self.ring is not None:
                seq.ring_row = self.ring.acquire()
            self.running.append(seq)

    def _release(self, seq: Sequence) -> None:
        self.blocks.release(seq.block_table)
        if self.ring is not None:
            self.ring.release(seq.ring_row)
        seq.ring_row = None

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed = seq.num_drafter_ctx = 0
        seq.pending_taps.clear()
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)
        seq.status, seq.finish_reason = Status.FINISHED, reason
