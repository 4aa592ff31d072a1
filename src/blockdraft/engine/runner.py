"""Batched model work for one engine step: prefill chunks, and propose → verify → accept.

One drafter forward and one target forward cover every decoding sequence (ragged
context lengths, padded blocks with masks). Token choice and acceptance are per
sequence, each with its own generator, so seeded results do not depend on who
else is in the batch. The runner reads sequences and writes none of their fields (sampling
advances each one's generator): it returns what each computed (`SeqOutput`) and
`Scheduler.postprocess` applies it.
"""

from __future__ import annotations

import abc
import time
import weakref
from dataclasses import dataclass, field

import torch

from ..cache.paged import PagedKVPool, PagedStep, SlotRow, context_read, pad_tables
from ..cache.plan import CachePlan
from ..cache.ring import DrafterRing
from ..cache.state import StatePool
from ..layers.vocab import argmax_ids
from ..models.drafter import BlockDrafter
from ..models.target import TargetModel
from ..sampling.probs import pick, sampling_probs
from ..spec_decode.propose import block_rows, choose_drafts, confident_prefix, draft_slots
from ..spec_decode.verify import greedy_accept_ids, rejection_accept
from .scheduler import ScheduledBatch
from .sequence import Sequence
from .spec import ModelSpec


@dataclass
class SeqOutput:
    """What one step computed for one sequence."""

    new_tokens: list[int]      # prefill: [first token] once the prompt is done, else []; decode: accepted
    #                            drafts + correction/bonus (not yet cut by stops or the token budget)
    computed: int = 0          # prefill: tokens with target KV and drafter context after this chunk
    context: int = 0           # decode: pending drafter-context rows written this step
    drafted: int = 0
    accepted: int = 0
    taps: torch.Tensor | None = None   # decode: taps of the verified block [1, 1 + drafted, F]


@dataclass
class StepOutputs:
    prefill: list[SeqOutput] = field(default_factory=list)
    decode: list[SeqOutput] = field(default_factory=list)
    decode_s: float = 0.0      # wall time of the decode half (what the width policy learns from)
    catch_up_s: float = 0.0    # of which: drafter context of earlier steps that did not draft (see flush_context)
    thread_look: bool = False  # run at a thread count only to measure it (threads.py): not what the width costs


def verify(seq: Sequence, block: list[int], logits: torch.Tensor, argmax: list[int], draft_q: torch.Tensor | None,
           taps: torch.Tensor | None, written: int) -> SeqOutput:
    """One sequence's verify: block [anchor, drafts...], the target's logits [len(block), V] over it (and
    their argmax) -> accepted drafts + correction/bonus (greedy prefix match, or rejection sampling
    against the draft distribution `draft_q` [n, V] with the sequence's own generator)."""
    if seq.params.greedy:
        accepted, nxt = greedy_accept_ids(block[1:], argmax)
    else:
        d = torch.tensor(block[1:], dtype=torch.long, device=logits.device)
        target_probs = sampling_probs(logits, seq.params)
        q = draft_q if draft_q is not None else target_probs[:0]
        accepted, nxt = rejection_accept(d, q, target_probs, seq.generator)
    return SeqOutput(block[1:1 + accepted] + [nxt], context=written, drafted=len(block) - 1, accepted=accepted,
                     taps=taps)


class StepRunner(abc.ABC):
    """What the engine asks of a backend each step. `run` is the one step body (prefill the scheduled
    chunks, then propose → verify → accept for the decoding sequences); a backend supplies the two model
    halves. `ModelRunner` runs the torch modules on paged pools; `onnx_runner.OnnxRunner` runs an export's
    graphs on onnxruntime. `ring` and `states` are the per-sequence resources the scheduler hands out
    (a drafter's sliding-window ring rows, a hybrid target's recurrent-state slots), None where absent."""

    ring = None
    states = None
    catch_up_s = 0.0           # set by a decode that wrote drafter context owed by earlier plain steps

    def run(self, batch: ScheduledBatch) -> StepOutputs:
        """Prefill the scheduled chunks, then propose → verify → accept for the decoding sequences."""
        out = StepOutputs(self.prefill(batch.prefill, batch.prefill_counts) if batch.prefill else [])
        if batch.decode:
            self.catch_up_s = 0.0
            t0 = time.perf_counter()
            out.decode = self.decode(batch.decode, batch.n_drafts)
            out.decode_s = time.perf_counter() - t0
            out.catch_up_s = self.catch_up_s
        return out

    @abc.abstractmethod
    def prefill(self, seqs: list[Sequence], counts: list[int]) -> list[SeqOutput]:
        """Run the next prompt chunk (`counts[i]` tokens) of each sequence; sample the first token of
        sequences whose prefill completes."""

    @abc.abstractmethod
    def decode(self, seqs: list[Sequence], n_drafts: list[int]) -> list[SeqOutput]:
        """One propose → verify → accept over the decoding sequences (`n_drafts[i]` drafts each)."""


class ModelRunner(StepRunner):
    """The torch modules' step: the target and drafter on paged pools (and a drafter ring, a hybrid
    target's state pool)."""

    def __init__(self, target: TargetModel, drafter: BlockDrafter | None, target_pool: PagedKVPool,
                 drafter_pool: PagedKVPool | None, confidence_threshold: float = 0.0, ring=None, states=None):
        self.target, self.drafter = target, drafter
        self.target_pool, self.drafter_pool, self.ring = target_pool, drafter_pool, ring
        self.states = states          # a hybrid target's recurrent state (cache/state.py), or None
        self.taps = drafter.config.taps if drafter is not None else ()
        self.confidence_threshold = confidence_threshold
        self.rows: weakref.WeakKeyDictionary[Sequence, SlotRow] = weakref.WeakKeyDictionary()   # see _row_pass

    @classmethod
    def on_pools(cls, target: TargetModel, drafter: BlockDrafter | None, spec: ModelSpec, plan: CachePlan,
                 max_batch: int, confidence_threshold: float = 0.0, state_rollback: str = "replay") -> "ModelRunner":
        """The runner with the pools `plan` sizes: the target's paged KV, a hybrid target's state slots
        (one per batch row), the drafter's paged KV for its full-attention layers and a ring for its
        sliding-window layers (`spec.drafter`'s split)."""
        n, bs, tc = plan.num_blocks, plan.page_size, target.config
        target_pool = PagedKVPool(tc.attention_layers, n, bs, *tc.paged_kv_geometry, target.dtype, target.device)
        states = (StatePool(tc.state_layout, max_batch, target.dtype, target.device, state_rollback)
                  if tc.hybrid else None)
        drafter_pool = ring = None
        if drafter is not None:
            dc, d = drafter.config, spec.drafter
            drafter_pool = PagedKVPool(list(d.full_layers), n if d.full_layers else 0, bs, dc.num_kv_heads,
                                       dc.head_dim, drafter.dtype, target.device)
            if d.ring_layers:
                ring = DrafterRing(list(d.ring_layers), max_batch, d.window, dc.block_size, dc.num_kv_heads,
                                   dc.head_dim, drafter.dtype, target.device)
        return cls(target, drafter, target_pool, drafter_pool, confidence_threshold, ring, states)

    def _tables(self, seqs: list[Sequence]) -> torch.Tensor:
        return pad_tables([s.block_table for s in seqs], self.target.device)

    def _drafter_step(self, seqs: list[Sequence], tables: torch.Tensor, starts: list[int],
                      counts: list[int]) -> PagedStep:
        """Where drafter context rows go: the mirrored paged pool, and the ring for sliding layers."""
        return PagedStep(self.drafter_pool, tables, starts, counts, attend=False, ring=self.ring,
                         ring_rows=[s.ring_row for s in seqs])

    def _ids(self, rows: list[list[int]]) -> torch.Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor([r + [0] * (width - len(r)) for r in rows], device=self.target.device)

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence], counts: list[int]) -> list[SeqOutput]:
        """Run the next prompt chunk (`counts[i]` tokens) of each sequence; the first token is sampled
        for sequences whose (fresh) prefill completes."""
        tables = self._tables(seqs)
        starts = [s.num_computed for s in seqs]
        ids = self._ids([s.tokens[a:a + c] for s, a, c in zip(seqs, starts, counts)])
        step = self._target_step(seqs, tables, starts, counts)
        last = torch.tensor([c - 1 for c in counts], device=ids.device)
        out = self.target(ids, step, self.taps, logits_at=last)
        self._commit_state(seqs, step, counts)
        if self.drafter is not None:
            self.drafter.extend_context(out.taps, self._drafter_step(seqs, tables, starts, counts))
        outs = []
        for i, (s, a, c) in enumerate(zip(seqs, starts, counts)):
            done_fresh = a + c == s.prefill_end and not s.generated
            outs.append(SeqOutput([int(pick(out.logits[i, 0], s.params, s.generator))] if done_fresh else [], a + c))
        return outs

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence], n_drafts: list[int]) -> list[SeqOutput]:
        if len(seqs) == 1 and n_drafts[0] == 0 and (out := self._row_pass(seqs[0])) is not None:
            s = seqs[0]
            return [verify(s, [s.tokens[-1]], out.logits[0], [int(out.argmax)], None, out.taps, 0)]
        tables = self._tables(seqs)
        starts = [len(s.tokens) - 1 for s in seqs]                  # anchor positions
        written = self.flush_context(seqs) if max(n_drafts) > 0 else [0] * len(seqs)
        drafts = self._propose(seqs, tables, starts, n_drafts)
        blocks = [[s.tokens[-1]] + d for s, d in zip(seqs, [p[0] for p in drafts])]
        step = self._target_step(seqs, tables, starts, [len(b) for b in blocks])
        out = self.target(self._ids(blocks), step, self.taps)      # logits [b, 1 + max n, V]
        target_argmax = (argmax_ids(out.logits) if out.argmax is None else out.argmax).tolist()   # [b, 1 + max n]
        outs = [verify(s, block, out.logits[i, :len(block)], target_argmax[i], drafts[i][1],
                       out.taps[i:i + 1, :len(block)] if self.drafter is not None else None, written[i])
                for i, (s, block) in enumerate(zip(seqs, blocks))]
        self._commit_state(seqs, step, [1 + o.accepted for o in outs])      # anchor + accepted drafts
        return outs

    def _row_pass(self, seq: Sequence):
        """A lone decoding row without drafts through `TargetModel.fused_row` (no tensor made for its inputs),
        its slots kept from step to step in `rows`; None where that pass does not take the target."""
        if self.states is not None or self.target.fused is None:
            return None
        position = len(seq.tokens) - 1
        if (row := self.rows.get(seq)) is None:
            row = self.rows[seq] = SlotRow(self.target_pool.page_size)
        row.sync(seq.block_table, position + 1)
        return self.target.fused_row(seq.tokens[-1], position, self.target_pool.row_kv(row, position), self.taps)

    def _target_step(self, seqs: list[Sequence], tables: torch.Tensor, starts: list[int],
                     counts: list[int]) -> PagedStep:
        """The target's view of a step: paged KV, and the recurrent state of a hybrid target's slots."""
        step = PagedStep(self.target_pool, tables, starts, counts)
        if self.states is not None:
            step.state = self.states.begin([s.state_slot for s in seqs], counts)
        return step

    def _commit_state(self, seqs: list[Sequence], step: PagedStep, keep: list[int]) -> None:
        """A hybrid target's state after each sequence's first keep[i] rows (KV rolls back by length alone)."""
        if self.states is not None:
            self.states.commit(step.state, [s.state_slot for s in seqs], keep)

    def _propose(self, seqs, tables, starts, n_drafts) -> list[tuple[list[int], torch.Tensor | None]]:
        if self.drafter is None or max(n_drafts) == 0:
            return [([], None) for _ in seqs]
        anchors = torch.tensor([s.tokens[-1] for s in seqs], device=tables.device)
        rows = [block_rows(self.drafter, n) for n in n_drafts]
        width = max(rows)
        block_valid = None
        if min(rows) != width:
            lengths = torch.tensor(rows, device=anchors.device)
            block_valid = torch.arange(width, device=anchors.device)[None, :] < lengths[:, None]
        ctx = context_read(self.drafter_pool, tables, starts, self.drafter.config.num_layers, self.ring,
                           [s.ring_row for s in seqs])
        hidden = self.drafter.block_hidden(anchors, width, ctx, block_valid)     # [b, width, D]
        proposals: list[tuple[list[int], torch.Tensor | None]] = [([], None) for _ in seqs]
        # greedy rows: one batched choice (slot i only depends on slots < i, so the longest n serves all)
        greedy = [i for i, (s, n) in enumerate(zip(seqs, n_drafts)) if n > 0 and s.params.greedy]
        if greedy:
            idx = torch.tensor(greedy, device=anchors.device)
            n_max = max(n_drafts[i] for i in greedy)
            p = choose_drafts(self.drafter, draft_slots(self.drafter, hidden[idx], n_max), anchors[idx],
                              seqs[greedy[0]].params, None)
            keep = confident_prefix(p, self.confidence_threshold)
            tokens = p.tokens.tolist()
            for row, i in enumerate(greedy):
                proposals[i] = (tokens[row][:min(n_drafts[i], keep[row])], None)
        # sampled rows: each with its own generator, so results do not depend on the batch
        for i, (s, n) in enumerate(zip(seqs, n_drafts)):
            if n == 0 or s.params.greedy:
                continue
            p = choose_drafts(self.drafter, draft_slots(self.drafter, hidden[i:i + 1], n), anchors[i:i + 1],
                              s.params, s.generator)
            p = p.truncated(min(n, confident_prefix(p, self.confidence_threshold)[0]))
            proposals[i] = (p.tokens[0].tolist(), None if p.draft_probs is None else p.draft_probs[0])
        return proposals

    @torch.inference_mode()
    def flush_context(self, seqs: list[Sequence]) -> list[int]:
        """Write each sequence's pending taps (committed rows of earlier steps) as drafter context, one
        batched call; returns the rows written per sequence. Context is written lazily, so steps that
        do not draft never pay for the drafter, and it is complete before the next drafting step."""
        written = [sum(t.shape[1] for t in s.pending_taps) for s in seqs]
        todo = [s for s, n in zip(seqs, written) if n]
        if self.drafter is None or not todo:
            return written
        t0 = time.perf_counter()
        rows = [torch.cat(s.pending_taps, dim=1) for s in todo]                    # each [1, n_i, F]
        counts = [r.shape[1] for r in rows]
        width = max(counts)
        taps = torch.cat([torch.nn.functional.pad(r, (0, 0, 0, width - r.shape[1])) for r in rows])
        step = self._drafter_step(todo, self._tables(todo), [s.num_drafter_ctx for s in todo], counts)
        self.drafter.extend_context(taps, step)
        # a step after drafting steps writes its predecessor's rows; rows beyond those are owed by steps that
        # did not draft, and their share of the time is not this step's width's own cost
        own = sum(s.pending_taps[-1].shape[1] for s in todo)
        self.catch_up_s = (time.perf_counter() - t0) * (1 - own / sum(counts))
        return written
