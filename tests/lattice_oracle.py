"""Single-sequence oracles for the lattice backends: one sequence through prefill → (draft lattice →
walk → verify → accept)*, over blockdraft's torch modules (`TorchLatticeBackend`, contiguous caches)
or an export's graphs on onnxruntime (`OnnxBackend`, its pages the pools' first blocks in order).
The engine runs the export batched (`engine/onnx_runner.py`); these pin what one sequence must give.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import torch

from decode_oracle import Generation, append_committed, verify_block
from blockdraft.models.drafter import BlockDrafter
from blockdraft.models.target import TargetModel
from blockdraft.sampling.params import SamplingParams
from blockdraft.sampling.probs import pick
from blockdraft.sampling.stops import StopCriteria
from blockdraft.export.runtime import OnnxModels
from blockdraft.spec_decode.lattice import Lattice, walk
from blockdraft.spec_decode.propose import block_lattice


class LatticeBackend(Protocol):
    vocab_size: int
    block_size: int
    num_draft_tokens: int
    mask_token_id: int

    def reset(self) -> None: ...
    def target_step(self, ids: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ids at positions start.. over the committed target cache [0, start):
        logits [t, V] fp32, taps [t, F]. Rows are not committed until `commit_target`."""
    def commit_target(self, length: int) -> None: ...
    def draft(self, new_taps: torch.Tensor, new_start: int, block_ids: list[int]) -> Lattice:
        """Append committed context rows (taps [t, F] at positions new_start..) and draft the block
        that follows them. Returns the lattice [1, n, K] / [1, n, K, K]."""


def lattice_generate(backend: LatticeBackend, prompt_ids: list[int], params: SamplingParams,
                     stop: StopCriteria | None = None) -> Generation:
    stop = stop or StopCriteria()
    generator = params.generator()
    backend.reset()
    t0 = time.perf_counter()
    logits, taps = backend.target_step(prompt_ids, 0)
    backend.commit_target(len(prompt_ids))
    tokens = [int(pick(logits[-1], params, generator))]
    gen = Generation(tokens)
    gen.prefill_s = time.perf_counter() - t0
    pending, pending_start = taps, 0              # context rows the drafter has not seen yet
    max_length = len(prompt_ids) + params.max_tokens
    start = len(prompt_ids)                       # absolute position of the anchor
    hit = stop.first_stop(tokens, 0)
    while hit is None and start + 1 < max_length:
        block = [tokens[-1]] + [backend.mask_token_id] * (backend.block_size - 1)
        lattice = backend.draft(pending, pending_start, block)
        drafts, draft_probs = walk(lattice, params, generator, backend.vocab_size)
        n = min(backend.num_draft_tokens, max_length - start - 1)
        drafts = drafts[0, :n]
        logits, taps = backend.target_step([tokens[-1]] + drafts.tolist(), start)     # [1 + n, V]
        new = verify_block(drafts, logits, None if draft_probs is None else draft_probs[0, :n], params, generator)
        produced, hit = append_committed(tokens, new, max_length - start - 1, stop)
        backend.commit_target(start + produced)
        pending, pending_start = taps[:produced], start
        gen.acceptance_lengths.append(produced)
        start += produced
    return gen.finish(t0, hit)


class TorchLatticeBackend:
    """blockdraft's torch modules behind the lattice-backend interface (contiguous caches)."""

    def __init__(self, target: TargetModel, drafter: BlockDrafter, top_k: int = 8, capacity: int = 1024):
        cfg = drafter.config
        self.target, self.drafter, self.capacity = target, drafter, capacity
        self.top_k = cfg.heads.selector_top_k if cfg.kind == "dflash2" else top_k
        self.vocab_size, self.block_size = cfg.vocab_size, cfg.block_size
        self.num_draft_tokens, self.mask_token_id = cfg.num_draft_tokens, cfg.mask_token_id
        self.reset()

    def reset(self) -> None:
        self.cache = self.target.new_cache(1, self.capacity)
        self.draft_cache = self.drafter.new_cache(1, self.capacity)

    @torch.inference_mode()
    def target_step(self, ids: list[int], start: int):
        self.cache.truncate(start)
        out = self.target(torch.tensor([ids]), self.cache, self.drafter.config.taps)
        return out.logits[0].float(), out.taps[0]

    def commit_target(self, length: int) -> None:
        self.cache.truncate(length)

    @torch.inference_mode()
    def draft(self, new_taps: torch.Tensor, new_start: int, block_ids: list[int]) -> Lattice:
        d = self.drafter
        if self.draft_cache.length != new_start:
            raise RuntimeError(f"drafter context holds {self.draft_cache.length} rows, new rows start at {new_start}")
        d.extend_context(new_taps[None], self.draft_cache)
        hidden = d.block_hidden_of(torch.tensor([block_ids]), self.draft_cache.context())
        return block_lattice(d, hidden, torch.tensor(block_ids[:1]), self.top_k)


class OnnxBackend(OnnxModels):
    """One sequence at a time as a `LatticeBackend`: its pages are the pools' first
    blocks in order."""

    def __init__(self, folder: str | Path, threads: int | None = None, capacity: int = 4096, pool_fill: float = 0.0):
        """`capacity`: the longest sequence (tokens) the pools hold; `pool_fill`: see `allocate`."""
        super().__init__(folder, threads)
        self.context_length = min(self.context_length, capacity)
        pages = -(-self.context_length // self.page)
        self.allocate(pages, pages + 1, pool_fill)
        self.reset()

    def _table(self, total: int) -> list[int]:
        return list(range(-(-total // self.page)))

    def reset(self) -> None:
        self.t_length = 0           # the pools keep stale rows; lengths say what is committed
        self.d_length = 0

    def target_step(self, ids: list[int], start: int):
        if start != self.t_length:
            raise RuntimeError(f"target cache holds {self.t_length} rows, step starts at {start}")
        return self.run_target(ids, [start], [len(ids)], [self._table(start + len(ids))])

    def commit_target(self, length: int) -> None:
        """The first `length` rows are committed (rows past it are overwritten by later steps)."""
        self.t_length = length

    def draft(self, new_taps: torch.Tensor, new_start: int, block_ids: list[int]) -> Lattice:
        if new_start != self.d_length:
            raise RuntimeError(f"drafter context holds {self.d_length} rows, new rows start at {new_start}")
        t = new_taps.shape[0]
        lattice = self.run_drafter(new_taps, block_ids, [new_start], [t], [True],
                                   [self._table(new_start + t + len(block_ids))])
        self.d_length = new_start + t
        return lattice
