"""Batched model work for one engine step: prefill chunks, and propose → verify → accept.

One drafter forward and one target forward cover every decoding sequence (ragged
context lengths, padded blocks with masks). Token choice and acceptance are per
sequence, each with its own generator, so seeded results do not depend on who
else is in the batch. Returns what each sequence committed; the engine applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache.paged import PagedKVPool, PagedStep, context_read, pad_tables
from ..models.drafter import BlockDrafter
from ..models.target import TargetModel
from ..sampling.probs import pick, sampling_probs
from ..spec_decode.propose import block_rows, choose_drafts, confident_prefix, draft_slots
from ..spec_decode.verify import greedy_accept_ids, rejection_accept
from .sequence import Sequence


@dataclass
class StepResult:
    new_tokens: list[int]      # accepted drafts + correction/bonus (not yet cut by stops/budget)
    drafted: int
    accepted: int


class ModelRunner:
    def __init__(self, target: TargetModel, drafter: BlockDrafter | None, target_pool: PagedKVPool,
                 drafter_pool: PagedKVPool | None, confidence_threshold: float = 0.0, ring=None):
        self.target, self.drafter = target, drafter
        self.target_pool, self.drafter_pool, self.ring = target_pool, drafter_pool, ring
        self.taps = drafter.config.taps if drafter is not None else ()
        self.confidence_threshold = confidence_threshold

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
    def prefill(self, seqs: list[Sequence], chunk: int) -> list[int | None]:
        """Run the next prompt chunk of each sequence; returns the first sampled token for
        sequences whose (fresh) prefill completed, None otherwise."""
        tables = self._tables(seqs)
        starts = [s.num_computed for s in seqs]
        counts = [min(chunk, s.prefill_end - s.num_computed) for s in seqs]
        ids = self._ids([s.tokens[a:a + c] for s, a, c in zip(seqs, starts, counts)])
        step = PagedStep(self.target_pool, tables, starts, counts)
        last = torch.tensor([c - 1 for c in counts], device=ids.device)
        out = self.target(ids, step, self.taps, logits_at=last)
        if self.drafter is not None:
            self.drafter.extend_context(out.taps, self._drafter_step(seqs, tables, starts, counts))
        firsts: list[int | None] = []
        for i, (s, a, c) in enumerate(zip(seqs, starts, counts)):
            s.num_computed = s.num_drafter_ctx = a + c
            done_fresh = s.num_computed == s.prefill_end and not s.generated
            firsts.append(int(pick(out.logits[i, 0], s.params, s.generator)) if done_fresh else None)
        return firsts

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence], n_drafts: list[int]) -> list[StepResult]:
        device = self.target.device
        tables = self._tables(seqs)
        starts = [len(s.tokens) - 1 for s in seqs]                  # anchor positions
        anchors = torch.tensor([s.tokens[-1] for s in seqs], device=device)
        if max(n_drafts) > 0:
            self.flush_context(seqs)
        drafts = self._propose(seqs, tables, starts, anchors, n_drafts)
        blocks = [[s.tokens[-1]] + d for s, d in zip(seqs, [p[0] for p in drafts])]
        step = PagedStep(self.target_pool, tables, starts, [len(b) for b in blocks])
        out = self.target(self._ids(blocks), step, self.taps)      # logits [b, 1 + max n, V]
        results = []
        target_argmax = out.logits.argmax(-1).tolist()              # [b, 1 + max n]
        for i, (s, block) in enumerate(zip(seqs, blocks)):
            logits = out.logits[i, :len(block)]
            if s.params.greedy:
                accepted, nxt = greedy_accept_ids(block[1:], target_argmax[i])
            else:
                d = torch.tensor(block[1:], dtype=torch.long, device=device)
                target_probs = sampling_probs(logits, s.params)
                q = drafts[i][1] if drafts[i][1] is not None else target_probs[:0]
                accepted, nxt = rejection_accept(d, q, target_probs, s.generator)
            results.append(StepResult(block[1:1 + accepted] + [nxt], len(block) - 1, accepted))
        self._pending_taps = (out.taps, tables, starts)
        return results

    def _propose(self, seqs, tables, starts, anchors, n_drafts) -> list[tuple[list[int], torch.Tensor | None]]:
        if self.drafter is None or max(n_drafts) == 0:
            return [([], None) for _ in seqs]
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

    def stash_context(self, seqs: list[Sequence], produced: list[int]) -> None:
        """Keep the taps of each sequence's committed rows (anchor + accepted) of the last decode.

        They become drafter context lazily (`flush_context`): steps that do not draft never pay
        for the drafter, and the context is complete again before the next drafting step.
        """
        if self.drafter is None:
            return
        taps = self._pending_taps[0]
        for i, (seq, n) in enumerate(zip(seqs, produced)):
            if n > 0:
                seq.pending_taps.append(taps[i:i + 1, :n])

    @torch.inference_mode()
    def flush_context(self, seqs: list[Sequence]) -> None:
        """Write pending taps as drafter context, one batched call for every sequence that has some."""
        if self.drafter is None:
            return
        todo = [s for s in seqs if s.pending_taps]
        if not todo:
            return
        rows = [torch.cat(s.pending_taps, dim=1) for s in todo]                    # each [1, n_i, F]
        counts = [r.shape[1] for r in rows]
        width = max(counts)
        taps = torch.cat([torch.nn.functional.pad(r, (0, 0, 0, width - r.shape[1])) for r in rows])
        step = self._drafter_step(todo, self._tables(todo), [s.num_drafter_ctx for s in todo], counts)
        self.drafter.extend_context(taps, step)
        for s, n in zip(todo, counts):
            s.num_drafter_ctx += n
            s.pending_taps.clear()
