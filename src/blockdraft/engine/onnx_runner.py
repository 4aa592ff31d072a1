"""The engine's runner over an `export onnx` directory: onnxruntime behind the same step.

The scheduler, block manager, width policy and verify are the engine's own; only the two model
calls differ. The graphs read the engine's block tables as they are (og.Engine's packed layout:
`export/runtime.py`), so one export serves og.Engine, this runner and the lattice loop.

- prefill: one target call over every scheduled chunk; the chunk's taps wait as drafter context
  (the drafter graph ingests context together with a block, as og.Engine feeds it).
- decode: one drafter call with every sequence's pending context rows and a block for each
  sequence that drafts -> a candidate lattice per block, walked with that sequence's sampling
  parameters and generator; then one target call over all [anchor, drafts...] blocks and the
  engine's `verify`.

A block's scratch rows may lie past a sequence's allocated pages (the width policy may verify fewer
drafts than a block holds): they go to spill pages, `ceil(B / page) + 1` per batch row, past the
engine's pages in the drafter pool. Prefix caching is off: a page's drafter context is written
lazily, so the scheduler cannot tell when another request may share it.
"""

from __future__ import annotations

import weakref

import torch

from ..cache.plan import KVGeometry
from ..sampling.probs import pick
from ..spec_decode.lattice import Lattice, walk
from .runner import SeqOutput, StepRunner, verify
from .sequence import Sequence
from .spec import DrafterSpec, ModelSpec


GRAPH_DTYPE_BYTES = 4      # the graphs' KV pools hold fp32


def onnx_spec(models) -> ModelSpec:
    """`export.runtime.OnnxModels` -> the engine's `ModelSpec`: a dense target (recurrent state is refused at
    export) and a drafter whose layers all attend over full pages (the graphs mask windows themselves)."""
    dec, drf = models.dims["decoder"], models.dims[models.kind]

    def kv(dims: dict) -> KVGeometry:
        return KVGeometry(int(dims["num_hidden_layers"]), int(dims["num_key_value_heads"]), int(dims["head_size"]),
                          GRAPH_DTYPE_BYTES)

    drafter = kv(drf)
    return ModelSpec(models.vocab_size, models.context_length, kv(dec), torch.device("cpu"),
                     drafter=DrafterSpec(models.kind, models.num_draft_tokens, models.block_size, drafter,
                                         tuple(range(drafter.num_layers))))


class OnnxRunner(StepRunner):
    """The engine's step over an export's graphs (module docstring)."""

    def __init__(self, models, num_blocks: int, max_batch: int, pool_fill: float = 0.0):
        self.models = models
        self.spill = -(-models.block_size // models.page) + 1
        self.num_blocks = num_blocks
        models.allocate(num_blocks, num_blocks + max_batch * self.spill, pool_fill)
        # per sequence: [drafter context rows written, taps of prefilled rows not yet written]
        self.context: weakref.WeakKeyDictionary[Sequence, list] = weakref.WeakKeyDictionary()

    def prefill(self, seqs: list[Sequence], counts: list[int]) -> list[SeqOutput]:
        starts = [s.num_computed for s in seqs]
        ids = [t for s, a, c in zip(seqs, starts, counts) for t in s.tokens[a:a + c]]
        logits, taps = self.models.run_target(ids, starts, counts, [s.block_table for s in seqs])
        outs, row = [], 0
        for s, a, c in zip(seqs, starts, counts):
            state = self.context.get(s)
            if state is None or a == 0:                 # a new (or preempted and recomputed) sequence
                state = self.context[s] = [0, []]
            state[1].append(taps[row:row + c])
            row += c
            done_fresh = a + c == s.prefill_end and not s.generated
            outs.append(SeqOutput([int(pick(logits[row - 1], s.params, s.generator))] if done_fresh else [], a + c))
        return outs

    def decode(self, seqs: list[Sequence], n_drafts: list[int]) -> list[SeqOutput]:
        if max(n_drafts) > 0:
            drafts, written = self._propose(seqs, n_drafts)
        else:                                   # pending context waits for a step that drafts
            drafts, written = [([], None)] * len(seqs), [0] * len(seqs)
        blocks = [[s.tokens[-1]] + d for s, (d, _) in zip(seqs, drafts)]
        logits, taps = self.models.run_target([t for b in blocks for t in b], [len(s.tokens) - 1 for s in seqs],
                                              [len(b) for b in blocks], [s.block_table for s in seqs])
        argmax = logits.argmax(-1).tolist()
        outs, row = [], 0
        for i, (s, block) in enumerate(zip(seqs, blocks)):
            rows = slice(row, row + len(block))
            outs.append(verify(s, block, logits[rows], argmax[rows], drafts[i][1], taps[rows][None], written[i]))
            row += len(block)
        return outs

    def _propose(self, seqs: list[Sequence], n_drafts: list[int]):
        """One drafter call: every sequence's pending context rows, a block for each that drafts.
        -> per sequence (drafts, draft distribution or None), and the pending rows of earlier steps
        written (`Sequence.pending_taps`, which the scheduler then clears)."""
        m = self.models
        rows, contexts, pasts, blocks, ids, tables, written = [], [], [], [], [], [], []
        for i, (s, n) in enumerate(zip(seqs, n_drafts)):
            state = self.context[s]
            new = state[1] + [t[0] for t in s.pending_taps]
            count = sum(r.shape[0] for r in new)
            written.append(sum(t.shape[1] for t in s.pending_taps))
            if state[0] + count != len(s.tokens) - 1:
                raise RuntimeError(f"{s.request_id}: drafter context would end at {state[0] + count}, "
                                   f"the anchor is at {len(s.tokens) - 1}")
            rows += new
            contexts.append(count)
            pasts.append(state[0])
            blocks.append(n > 0)
            if n > 0:
                ids += [s.tokens[-1]] + [m.mask_token_id] * (m.block_size - 1)
            spill = range(self.num_blocks + i * self.spill, self.num_blocks + (i + 1) * self.spill)
            tables.append(s.block_table + list(spill))
            state[0], state[1] = state[0] + count, []
        taps = torch.cat(rows) if rows else torch.zeros(0, m.tap_width)
        lattice = m.run_drafter(taps, ids, pasts, contexts, blocks, tables)
        out, k = [], 0
        for s, n in zip(seqs, n_drafts):
            if n == 0:
                out.append(([], None))
                continue
            one = Lattice(lattice.candidate_ids[k:k + 1], lattice.scores[k:k + 1])
            d, q = walk(one, s.params, s.generator, m.vocab_size)
            out.append((d[0, :n].tolist(), None if q is None else q[0, :n]))
            k += 1
        return out, written


def onnx_engine(folder, max_batch: int = 1, eos_ids: frozenset[int] = frozenset(), decode=None,
                adaptive_speculation: bool = True, num_speculative_tokens: int | None = None, pool_fill: float = 0.0):
    """An `LLMEngine` whose runner runs the export in `folder` with onnxruntime."""
    from ..export.runtime import OnnxModels
    from .engine import EngineConfig, LLMEngine

    models = OnnxModels(folder)
    spec = onnx_spec(models)
    config = EngineConfig(max_batch=max_batch, prefix_caching=False, adaptive_speculation=adaptive_speculation,
                          num_speculative_tokens=num_speculative_tokens,
                          cache_budget_bytes=spec.cache_budget(models.context_length, max_batch))
    engine = LLMEngine.over(spec, lambda plan: OnnxRunner(models, plan.num_blocks, max_batch, pool_fill), config,
                            eos_ids | frozenset(models.eos_token_ids), decode)
    engine.models = models
    return engine
