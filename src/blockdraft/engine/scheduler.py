"""Who runs each step, and what its results do to them. Bookkeeping only: no model math here.

`schedule()`: admission, capacity per step, preemption, the draft budget. Each decoding
sequence needs slots for `anchor + n drafts` (k + 1 new positions, not one). Sequences are
served oldest first; when the pool runs dry the youngest running sequence is preempted (its
blocks and recurrent-state slot freed, its tokens kept) and recomputed later, which leaves its output
unchanged (every row, prefill or verify, runs the same per-row arithmetic).

`postprocess()`: the one writer of `Sequence` after a step — commit, stop cut and token
budget, drafter context, prefix-cache registration, finishing.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from ..cache.block_manager import BlockManager
from ..sampling.stops import StopCriteria
from .policy import DraftWidthPolicy
from .sequence import Sequence, Status
from .telemetry import EngineStats


@dataclass
class ScheduledBatch:
    prefill: list[Sequence] = field(default_factory=list)
    prefill_counts: list[int] = field(default_factory=list)   # prompt tokens each prefills this step
    decode: list[Sequence] = field(default_factory=list)
    n_drafts: list[int] = field(default_factory=list)         # drafts each decoding sequence verifies
    width: int = 0                                            # the policy's width for greedy sequences


class Scheduler:
    def __init__(self, blocks: BlockManager, max_batch: int, lookahead: int, prefill_chunk: int,
                 policy: DraftWidthPolicy, stats: EngineStats, eos_ids: frozenset[int] = frozenset(),
                 decode_text=None, drafting: bool = False, ring=None, states=None):
        self.blocks, self.max_batch, self.ring, self.states = blocks, max_batch, ring, states
        self.lookahead, self.prefill_chunk = lookahead, prefill_chunk
        self.policy, self.stats, self.drafting = policy, stats, drafting
        self.eos_ids, self.decode_text = eos_ids, decode_text
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def drafts_for(self, seq: Sequence) -> int:
        """Drafts this step: never past the token budget."""
        start = len(seq.tokens) - 1
        return max(0, min(self.lookahead, seq.max_length - start - 1))

    def schedule(self) -> ScheduledBatch:
        """This step's prefill chunks and decoding sequences, with the drafts each verifies."""
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
        counts = [min(self.prefill_chunk, s.prefill_end - s.num_computed) for s in prefill]
        width = self.policy.choose(len(decode)) if decode else 0
        n_drafts = [min(width, self.drafts_for(s)) if s.params.greedy else self.drafts_for(s) for s in decode]
        return ScheduledBatch(prefill, counts, decode, n_drafts, width)

    def postprocess(self, batch: ScheduledBatch, out) -> list[Sequence]:
        """Apply a step's `StepOutputs` to its sequences; returns those with new tokens (or finished)."""
        touched = []
        for seq in batch.prefill + batch.decode:
            seq.unread = 0
        for seq, o in zip(batch.prefill, out.prefill):
            seq.num_computed = seq.num_drafter_ctx = o.computed
            if seq.num_computed == seq.prefill_end:
                seq.status = Status.DECODE
            if o.new_tokens:
                seq.first_token_time = time.perf_counter()
                self.stats.ttft_s.append(seq.first_token_time - seq.arrival_time)
                self._commit(seq, o.new_tokens)
                touched.append(seq)
        if not batch.decode:
            return touched
        for seq, o in zip(batch.decode, out.decode):
            if o.context:                    # the runner wrote every pending row
                seq.num_drafter_ctx += o.context
                seq.pending_taps.clear()
            kept = self._commit(seq, o.new_tokens, o)
            if seq.is_finished:
                continue
            if self.drafting and kept:       # taps of anchor + accepted: drafter context next time it drafts
                seq.pending_taps.append(o.taps[:, :kept])
            seq.num_computed = len(seq.tokens) - 1
            # only blocks whose drafter context is written may be shared
            seq.registered = self.blocks.register(seq.block_table, seq.tokens,
                                                  seq.num_drafter_ctx if self.drafting else seq.num_computed,
                                                  seq.registered)
        self.policy.record(len(batch.decode), batch.width, out.decode_s - out.catch_up_s, [o.drafted for o in out.decode],
                           [o.accepted for o in out.decode], out.catch_up_s, timed=not out.thread_look)
        return touched + batch.decode

    def _commit(self, seq: Sequence, new: list[int], step=None) -> int:
        """Append committed tokens, cut by the token budget and stops; returns how many were kept."""
        keep = min(len(new), seq.max_length - len(seq.tokens))
        before = len(seq.tokens)
        seq.tokens.extend(new[:keep])
        stop = StopCriteria(frozenset() if seq.params.ignore_eos else self.eos_ids, seq.params.stop or (),
                            self.decode_text)
        hit = stop.first_stop(seq.generated, before - seq.num_prompt)
        if hit is not None:
            del seq.tokens[seq.num_prompt + hit[0]:]
        kept = len(seq.tokens) - before
        seq.unread += kept
        self.stats.spec.generated += kept
        if step is not None and self.drafting:
            seq.acceptance_lengths.append(kept)
            seq.drafted += step.drafted
            seq.accepted += min(step.accepted, kept)
            self.stats.spec.record_step(step.drafted, min(step.accepted, kept), kept)
        if hit is not None:
            self.finish(seq, hit[1])
        elif len(seq.tokens) >= seq.max_length:
            self.finish(seq, "length")
        return kept

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            hits = self.blocks.match_prefix(seq.tokens[: seq.prefill_end - 1])
            if not self.blocks.allocate(seq.block_table, len(seq.tokens) + self.lookahead, hits):
                break
            self.waiting.popleft()
            seq.num_computed = seq.num_drafter_ctx = len(hits) * self.blocks.page_size
            seq.status = Status.PREFILL
            if self.ring is not None:
                seq.ring_row = self.ring.acquire()
            if self.states is not None:
                seq.state_slot = self.states.acquire()
            self.running.append(seq)

    def _release(self, seq: Sequence) -> None:
        self.blocks.release(seq.block_table)
        seq.registered = (0, 0)
        if self.ring is not None:
            self.ring.release(seq.ring_row)
        if self.states is not None:
            self.states.release(seq.state_slot)
        seq.ring_row = seq.state_slot = None

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed = seq.num_drafter_ctx = 0
        seq.pending_taps.clear()
        seq.status = Status.WAITING
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._release(seq)
        seq.status, seq.finish_reason = Status.FINISHED, reason
        seq.finish_time = time.perf_counter()
        self.stats.requests_finished[reason] += 1
