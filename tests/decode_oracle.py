"""The single-sequence reference loop: prefill → (propose → verify → accept)*, the tests' oracle
(and a few single-stream micro-benchmarks'). No command, server or API path runs it — they run
the batch engine — but it calls the same drafting (`choose_drafts`) and `spec_decode.verify`
functions, so the engine at any batch and width is checked against the plainest possible loop.

The first token is sampled from the prefill's last logits and becomes the first
anchor; the taps of every prompt token form the drafter's initial context. Each
step verifies `[anchor, d_1..d_n]` in one target pass and commits
`anchor + accepted drafts`; the correction/bonus token becomes the next anchor.
Without a drafter the same loop is plain autoregressive decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from blockdraft.engine.admission import check_request
from blockdraft.engine.telemetry import Rates
from blockdraft.layers.vocab import argmax_ids
from blockdraft.models.drafter import BlockDrafter
from blockdraft.models.kv_cache import KVCache
from blockdraft.models.target import TargetModel
from blockdraft.sampling.params import SamplingParams
from blockdraft.sampling.probs import pick, sampling_probs
from blockdraft.sampling.stops import StopCriteria
from blockdraft.spec_decode.propose import Proposal, block_rows, choose_drafts, confident_prefix, draft_slots
from blockdraft.spec_decode.verify import greedy_accept_ids, rejection_accept


def propose(drafter: BlockDrafter, anchor: torch.Tensor, cache: KVCache, n_drafts: int,
            params: SamplingParams, generator: torch.Generator | None,
            confidence_threshold: float = 0.0) -> Proposal:
    """anchor [b] at position cache.length -> Proposal with at most n_drafts drafts (the engine's
    `_propose` batched over ragged sequences does the same through a paged context)."""
    rows = block_rows(drafter, n_drafts)
    hidden = drafter.block_hidden(anchor, rows, cache)
    proposal = choose_drafts(drafter, draft_slots(drafter, hidden, n_drafts), anchor, params, generator)
    return proposal.truncated(min(confident_prefix(proposal, confidence_threshold)))


def greedy_accept(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """drafts [n], target_logits [n+1, vocab] -> (accepted m, next token)."""
    return greedy_accept_ids(drafts.tolist(), argmax_ids(target_logits).tolist())


@dataclass
class Generation(Rates):
    token_ids: list[int]                                        # generated only
    acceptance_lengths: list[int] = field(default_factory=list)  # per verify step: accepted drafts + 1
    finish_reason: str = "length"
    prefill_s: float = 0.0
    decode_s: float = 0.0

    def finish(self, started: float, hit: tuple[int, str] | None) -> "Generation":
        """Record decode time (since `started`, minus prefill) and the stop reason, if any."""
        self.decode_s = time.perf_counter() - started - self.prefill_s
        if hit is not None:
            self.finish_reason = hit[1]
        return self


def verify_block(drafts: torch.Tensor, logits: torch.Tensor, draft_probs: torch.Tensor | None,
                 params: SamplingParams, generator: torch.Generator | None) -> list[int]:
    """drafts [n], target logits [n + 1, V] over [anchor, drafts] -> accepted drafts + the correction
    or bonus token (greedy prefix match, or rejection sampling against `draft_probs` [n, V])."""
    if params.greedy:
        accepted, next_token = greedy_accept(drafts, logits)
    else:
        target_probs = sampling_probs(logits, params)
        probs = draft_probs if draft_probs is not None else target_probs[:0]
        accepted, next_token = rejection_accept(drafts, probs, target_probs, generator)
    return drafts[:accepted].tolist() + [next_token]


def append_committed(tokens: list[int], new: list[int], room: int, stop: StopCriteria):
    """Append up to `room` of `new`, cut at the first stop. Returns (tokens committed, stop hit or None)."""
    produced = min(len(new), room)
    tokens.extend(new[:produced])
    hit = stop.first_stop(tokens, len(tokens) - produced)
    if hit is not None:
        produced -= len(tokens) - hit[0]
        del tokens[hit[0]:]
    return produced, hit


@torch.inference_mode()
def generate_one(target: TargetModel, prompt_ids: list[int], params: SamplingParams,
                 drafter: BlockDrafter | None = None, stop: StopCriteria | None = None,
                 confidence_threshold: float = 0.0) -> Generation:
    check_request(target.config, prompt_ids, params)
    stop = stop or StopCriteria()
    generator = params.generator(target.device)
    taps = drafter.config.taps if drafter is not None else ()
    prompt_len = len(prompt_ids)
    max_length = prompt_len + params.max_tokens
    margin = drafter.config.block_size + 1 if drafter is not None else 1
    cache = target.new_cache(1, max_length + margin)
    draft_cache = drafter.new_cache(1, max_length + margin) if drafter is not None else None

    t0 = time.perf_counter()
    out = target(torch.tensor([prompt_ids], device=target.device), cache, taps, logits_rows=1)
    cache.truncate(prompt_len)
    tokens = [int(pick(out.logits[0, -1], params, generator))]
    if drafter is not None:
        drafter.extend_context(out.taps, draft_cache)
    gen = Generation(tokens)
    gen.prefill_s = time.perf_counter() - t0

    hit = stop.first_stop(tokens, 0)
    start = prompt_len  # absolute position of the anchor
    while hit is None and start + 1 < max_length:
        anchor = torch.tensor([tokens[-1]], device=target.device)
        n_drafts = min(drafter.config.num_draft_tokens, max_length - start - 1) if drafter is not None else 0
        proposal = None
        if n_drafts > 0:
            proposal = propose(drafter, anchor, draft_cache, n_drafts, params, generator, confidence_threshold)
            block = torch.cat([anchor[:, None], proposal.tokens], dim=1)             # [1, 1 + n]
        else:
            block = anchor[:, None]
        out = target(block, cache, taps)                                              # logits [1, 1 + n, V]
        drafts = block[0, 1:]
        draft_probs = proposal.draft_probs[0] if proposal is not None and proposal.draft_probs is not None else None
        new = verify_block(drafts, out.logits[0], draft_probs, params, generator)
        produced, hit = append_committed(tokens, new, max_length - start - 1, stop)
        cache.truncate(start + produced)           # anchor + accepted drafts are committed
        if drafter is not None:
            drafter.extend_context(out.taps[:, :produced], draft_cache)
            gen.acceptance_lengths.append(produced)
        start += produced
    return gen.finish(t0, hit)


@torch.inference_mode()
def generate_cache_free(target: TargetModel, prompt_ids: list[int], max_tokens: int,
                        drafter: BlockDrafter | None = None) -> Generation:
    """Greedy speculative decoding with no cache at all: every step recomputes the target over the
    whole committed sequence + block from scratch (fresh KV and, for hybrid targets, fresh recurrent
    state) and rebuilds the drafter's context from all committed taps. The oracle for targets whose
    state cannot be rolled back by length: nothing here is rolled back."""
    params = SamplingParams(max_tokens=max_tokens)
    taps = drafter.config.taps if drafter is not None else ()
    max_length = len(prompt_ids) + max_tokens
    tokens = list(prompt_ids)
    out = target(torch.tensor([tokens], device=target.device), None, taps)
    tokens.append(int(argmax_ids(out.logits[0, -1:])[0]))
    gen = Generation([])
    while len(tokens) < max_length:
        anchor = torch.tensor([tokens[-1]], device=target.device)
        committed = torch.tensor([tokens[:-1]], device=target.device)
        drafts = torch.zeros(1, 0, dtype=torch.long, device=target.device)
        n = min(drafter.config.num_draft_tokens, max_length - len(tokens)) if drafter is not None else 0
        if n > 0:
            context = target(committed, None, taps).taps                          # [1, L, F]
            draft_cache = drafter.new_cache(1, context.shape[1] + drafter.config.block_size + 1)
            drafter.extend_context(context, draft_cache)
            drafts = propose(drafter, anchor, draft_cache, n, params, None).tokens
        full = torch.cat([committed, anchor[:, None], drafts], dim=1)
        logits = target(full, None, taps).logits[0, committed.shape[1]:]          # [1 + n, V]
        new = verify_block(drafts[0], logits, None, params, None)
        keep = new[:max_length - len(tokens)]
        tokens.extend(keep)
        if drafter is not None:
            gen.acceptance_lengths.append(len(keep))
    gen.token_ids = tokens[len(prompt_ids):]
    return gen
