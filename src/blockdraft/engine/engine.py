"""`LLMEngine`: requests in, committed tokens out, many sequences per step.

    add_request(prompt_ids, params) -> request_id     abort(request_id)
    step() -> [RequestOutput]      stream(request_id)   generate(prompts, params)

Each step is schedule → run → postprocess: the scheduler picks who prefills a chunk and
who decodes with how many drafts (allocating k+1 slots each, preempting the youngest when
the pool is dry); the runner does one batched prefill and one batched propose → verify →
accept; the scheduler applies the results (commit, stops, budgets, drafter context, prefix
cache, finished requests). generate, serve, bench, LLM, tensor-parallel ranks, held-out
evaluation and teacher data run this step, and `generate --onnx` runs it with onnxruntime behind
the runner (`onnx_runner.py`).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..cache.block_manager import BlockManager
from ..cache.state import ROLLBACKS
from ..cache.plan import PAGE_SIZE, CachePlan, plan_cache
from .admission import check_request
from ..errors import ConfigError, RequestError
from ..models.drafter import BlockDrafter
from ..models.target import TargetModel
from ..sampling.params import SamplingParams
from .policy import DraftWidthPolicy
from .runner import ModelRunner, StepRunner
from .scheduler import Scheduler
from .sequence import Sequence
from .spec import ModelSpec
from .threads import ThreadChoice
from .telemetry import EngineStats, Rates

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    max_batch: int = 8
    cache_budget_bytes: int = 64 * 2**20
    page_size: int = PAGE_SIZE             # tokens per KV cache page (block-table entry)
    prefill_chunk: int = 256
    prefix_caching: bool = True
    confidence_threshold: float = 0.0
    max_model_len: int | None = None       # default: the target's max_position_embeddings
    adaptive_speculation: bool = True      # greedy draft width from measured cost (policy.py); off = full width
    num_speculative_tokens: int | None = None  # cap on drafts per step (default: the drafter's block)
    policy_file: str | None = None         # where the width policy's measurements persist (None: nowhere)
    adaptive_threads: bool = True          # CPU: torch's thread count or one per step, as measured (threads.py)
    state_rollback: str = "replay"         # hybrid targets: "replay" or "per_row" (cache/state.py)

    def __post_init__(self):
        if self.max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < 0:
            raise ConfigError(f"num_speculative_tokens must be >= 0, got {self.num_speculative_tokens}")
        if self.prefill_chunk < 1:
            raise ConfigError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.state_rollback not in ROLLBACKS:
            raise ConfigError(f"state_rollback must be one of {ROLLBACKS}, got {self.state_rollback!r}")


@dataclass
class RequestOutput(Rates):
    """One request as the engine (and `LLM.generate`, the server, `generate`) reports it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]                 # all generated so far
    new_token_ids: list[int]             # committed since the last output for this request
    acceptance_lengths: list[int]        # per verify step: tokens committed (accepted drafts + 1)
    finished: bool
    finish_reason: str | None
    prefill_s: float = 0.0               # arrival -> first token (includes queueing)
    decode_s: float = 0.0                # first token -> finish
    drafted: int = 0
    accepted: int = 0
    text: str = ""                       # decoded, cut at stop strings (filled by `LLM.generate`)


class LLMEngine:
    def __init__(self, target: TargetModel, drafter: BlockDrafter | None = None,
                 config: EngineConfig | None = None, eos_ids: frozenset[int] = frozenset(), decode=None):
        """The engine over torch modules: the target and drafter on paged pools the cache plan sizes."""
        config = config or EngineConfig()
        self.target, self.drafter = target, drafter
        spec = ModelSpec.of(target, drafter)
        self._start(spec, config, eos_ids, decode,
                    lambda plan: ModelRunner.on_pools(target, drafter, spec, plan, config.max_batch,
                                                      config.confidence_threshold, config.state_rollback),
                    adaptive_threads=target.device.type == "cpu")

    @classmethod
    def over(cls, spec: ModelSpec, runner, config: EngineConfig | None = None, eos_ids: frozenset[int] = frozenset(),
             decode=None) -> "LLMEngine":
        """The engine over models another backend runs: `runner(plan)` builds that backend's `StepRunner`
        on the cache plan (`onnx_runner.py`)."""
        engine = cls.__new__(cls)
        engine.target = engine.drafter = None
        engine._start(spec, config or EngineConfig(), eos_ids, decode, runner, adaptive_threads=False)
        return engine

    def _start(self, spec: ModelSpec, config: EngineConfig, eos_ids: frozenset[int], decode, runner,
               adaptive_threads: bool) -> None:
        self.spec, self.config = spec, config
        self.max_model_len = config.max_model_len or spec.max_position_embeddings
        self.lookahead = spec.lookahead
        if config.num_speculative_tokens is not None:
            self.lookahead = min(self.lookahead, config.num_speculative_tokens)
        prefix_caching = config.prefix_caching
        self.prefix_caching_off: str | None = None if prefix_caching else "off in EngineConfig"
        if prefix_caching and spec.no_prefix_sharing:
            prefix_caching, self.prefix_caching_off = False, spec.no_prefix_sharing
        d = spec.drafter
        if prefix_caching and d is not None and d.ring_layers:   # a ring holds one sequence's recent rows
            prefix_caching = False
            self.prefix_caching_off = "off: the drafter's sliding-window ring holds one sequence's rows"
        self.plan: CachePlan = plan_cache(config.cache_budget_bytes, config.page_size, config.max_batch,
                                          self.max_model_len, self.lookahead + 1, spec.kv,
                                          d.layer_kv(d.full_layers) if d else None,
                                          d.window if d and d.ring_layers else None, d.block_size if d else 0,
                                          d.layer_kv(d.ring_layers) if d else None, spec.state_bytes)
        n = self.plan.num_blocks
        self.blocks = BlockManager(n, self.plan.page_size, prefix_caching)
        self.runner: StepRunner = runner(self.plan)
        self.policy = DraftWidthPolicy(self.lookahead, config.adaptive_speculation)
        self.threads = ThreadChoice(enabled=config.adaptive_threads and adaptive_threads)
        self._load_policy()
        self.stats = EngineStats(blocks_total=n, blocks_free=n)
        self.scheduler = Scheduler(self.blocks, config.max_batch, self.lookahead, config.prefill_chunk,
                                   self.policy, self.stats, eos_ids, decode, d is not None,
                                   self.runner.ring, self.runner.states)
        self.seqs: dict[str, Sequence] = {}
        self._ids = itertools.count()

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.scheduler.eos_ids

    @eos_ids.setter
    def eos_ids(self, ids: frozenset[int]) -> None:
        self.scheduler.eos_ids = frozenset(ids)

    # ---- requests -------------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        params = params or SamplingParams()
        check_request(self.spec, prompt_ids, params, self.max_model_len)
        needed = self.blocks.blocks_for(len(prompt_ids) + params.max_tokens + self.lookahead + 1)
        if needed > self.plan.num_blocks:
            raise RequestError(f"request needs {needed} cache pages but the budget holds {self.plan.num_blocks}",
                               "max_tokens")
        order = next(self._ids)
        rid = request_id or f"req-{order}"
        if rid in self.seqs:
            raise RequestError(f"request_id {rid!r} is already in use")
        seq = Sequence(rid, list(prompt_ids), params, order, params.generator(self.spec.device))
        self.seqs[rid] = seq
        self.scheduler.add(seq)
        return rid

    def abort(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id, None)
        if seq is not None and not seq.is_finished:
            self.scheduler.finish(seq, "abort")
            self._refresh_gauges()

    def abort_all(self, reason: str = "error") -> list[str]:
        """End every unfinished request (after a failed step: the engine is consistent again, every
        block is back in the pool); returns their ids."""
        victims = list(self.scheduler.running) + list(self.scheduler.waiting)
        for seq in victims:
            self.scheduler.finish(seq, reason)
            self.seqs.pop(seq.request_id, None)
        self._refresh_gauges()
        return [s.request_id for s in victims]

    def _load_policy(self) -> None:
        path = self.config.policy_file
        if path is None or not self.policy.enabled or not os.path.isfile(path):
            return
        try:
            with open(path) as f:
                restored = self.policy.restore(json.load(f))
        except (OSError, ValueError, KeyError, TypeError) as e:
            restored = False
            log.warning("width policy: ignoring %s (%s)", path, e)
        if not restored:
            log.warning("width policy: %s does not fit this engine; measuring afresh", path)

    def save_policy(self) -> None:
        """Write what the width policy measured to `policy_file` (atomically), if one is set."""
        path = self.config.policy_file
        if path is None or not self.policy.enabled or not self.policy.cost:
            return
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.policy.state(), f)
        os.replace(tmp, path)

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running)

    # ---- the step -------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        touched = self.scheduler.postprocess(batch, self._run(batch))
        self.stats.steps += 1
        self.stats.busy_s += time.perf_counter() - t0
        if self.stats.steps % 512 == 0:
            self.save_policy()
        self._refresh_gauges()
        outputs = [self._output(s) for s in touched]
        for seq in touched:                  # a finished request's last output says everything: forget it
            if seq.is_finished:
                self.seqs.pop(seq.request_id, None)
        return outputs

    def _run(self, batch):
        """The runner's step at the thread count `self.threads` picks for its decode half (the same bits at
        any count); the process's own count is restored after."""
        before = torch.get_num_threads()
        if before != self.threads.most:                          # the caller changed it: theirs
            return self.runner.run(batch)
        key = (DraftWidthPolicy.bucket(len(batch.decode)), batch.width) if batch.decode else None
        threads = self.threads.pick(key) if key else self.threads.current     # prefill alone: the last choice
        torch.set_num_threads(threads)
        try:
            out = self.runner.run(batch)
        finally:
            torch.set_num_threads(before)
        if key:
            self.threads.record(key, threads, out.decode_s)
            out.thread_look = self.threads.looks_at(threads)
        return out

    def _refresh_gauges(self) -> None:
        s = self.stats
        s.num_waiting, s.num_running = len(self.scheduler.waiting), len(self.scheduler.running)
        s.blocks_free = self.blocks.num_free
        s.preemptions = self.scheduler.preemptions
        s.prefix_hits, s.prefix_queries = self.blocks.hits, self.blocks.queries

    def _output(self, seq: Sequence) -> RequestOutput:
        gen = seq.generated
        new = gen[len(gen) - seq.unread:] if seq.unread else []
        first = seq.first_token_time or seq.finish_time or seq.arrival_time
        return RequestOutput(seq.request_id, seq.prompt_ids, list(gen), new, list(seq.acceptance_lengths),
                             seq.is_finished, seq.finish_reason, first - seq.arrival_time,
                             (seq.finish_time or first) - first, seq.drafted, seq.accepted)

    # ---- convenience ----------------------------------------------------------------------------------
    def stream(self, request_id: str) -> Iterator[list[int]]:
        """Yield this request's tokens as they are committed (driving the engine as needed)."""
        seq = self.seqs[request_id]
        sent = 0
        while True:
            if len(seq.generated) > sent:
                yield seq.generated[sent:]
                sent = len(seq.generated)
            if seq.is_finished:
                self.save_policy()
                return
            self.step()

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
                 ) -> list[RequestOutput]:
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            done.update((o.request_id, o) for o in self.step() if o.finished)
        self.save_policy()
        return [done[r] for r in ids]


def default_cache_budget(target: TargetModel, drafter: BlockDrafter | None, max_len: int, max_batch: int) -> int:
    """Room for `max_batch` sequences of `max_len` tokens (+ lookahead), target and drafter KV."""
    return ModelSpec.of(target, drafter).cache_budget(max_len, max_batch)


def sized_engine(target: TargetModel, drafter: BlockDrafter | None, max_batch: int, max_len: int,
                 eos_ids: frozenset[int], adaptive_speculation: bool = True,
                 num_speculative_tokens: int | None = None) -> LLMEngine:
    """An engine whose cache holds `max_batch` sequences of `max_len` tokens (rounded up to whole
    pages): what bench, held-out evaluation and teacher-data generation run."""
    max_len = -(-max_len // PAGE_SIZE) * PAGE_SIZE
    return LLMEngine(target, drafter, EngineConfig(
        max_batch=max_batch, max_model_len=max_len, adaptive_speculation=adaptive_speculation,
        num_speculative_tokens=num_speculative_tokens,
        cache_budget_bytes=default_cache_budget(target, drafter, max_len, max_batch)), eos_ids)
