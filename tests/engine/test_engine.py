"""Continuous batching reproduces single-stream decoding, under arrivals, aborts and preemption."""

import dataclasses
import random

import pytest

from decode_oracle import generate_one
from blockdraft.engine.engine import EngineConfig, LLMEngine
from blockdraft.errors import RequestError
from blockdraft.layers import cpu_kernels as kernels
from blockdraft.sampling.params import SamplingParams
from conftest import random_prompts

PROMPTS = random_prompts(32, seed=21, low=2, high=40)
PARAMS = [SamplingParams(max_tokens=m) for m in random.Random(3).choices([1, 5, 17, 30], k=32)]
TIGHT = EngineConfig(max_batch=8, cache_budget_bytes=260_000, page_size=8, max_model_len=72, prefill_chunk=16)
# every step drafts: whether drafts are accepted must not depend on how fast this machine is right now
TIGHT_DRAFTING = dataclasses.replace(TIGHT, adaptive_speculation=False)


@pytest.fixture(scope="module")
def single_stream(target):
    return [generate_one(target, p, sp).token_ids for p, sp in zip(PROMPTS, PARAMS)]


@pytest.mark.parametrize("kind", [None, "dflash", "dflash2", "dspark"])
def test_random_arrivals_aborts_and_preemption_match_single_stream(target, drafters, single_stream, kind):
    engine = LLMEngine(target, drafters[kind] if kind else None, TIGHT_DRAFTING)
    rng = random.Random(kind or "ar")
    pending = list(range(len(PROMPTS)))
    rng.shuffle(pending)
    ids, aborted, outs = {}, set(), {}
    while pending or engine.has_unfinished():
        for _ in range(rng.choice([0, 0, 1, 3])):       # random arrival times
            if pending:
                i = pending.pop()
                ids[engine.add_request(PROMPTS[i], PARAMS[i])] = i
        if rng.random() < 0.05 and ids:                  # random aborts
            victim = rng.choice(sorted(ids))
            if victim not in outs:
                engine.abort(victim)
                aborted.add(victim)
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
    assert engine.stats.preemptions > 0, "budget was meant to force preemption"
    assert set(outs) | aborted == set(ids) and not set(outs) & aborted
    finished = 0
    for rid, out in outs.items():
        assert out.token_ids == single_stream[ids[rid]], f"request {rid} (prompt {ids[rid]}) differs"
        finished += 1
    assert finished >= 20
    assert engine.blocks.num_free == engine.plan.num_blocks
    assert all(r == 0 for r in engine.blocks.ref)
    if kind:
        assert engine.stats.spec.accepted > 0


def test_seeded_sampling_is_batch_invariant(target, drafters):
    params = [SamplingParams(max_tokens=20, temperature=0.9, top_p=0.95, seed=100 + i) for i in range(8)]
    prompts = PROMPTS[:8]
    cfg = EngineConfig(max_batch=8, cache_budget_bytes=2_000_000, page_size=8, max_model_len=72)
    batched = LLMEngine(target, drafters["dspark"], cfg).generate(prompts, params)
    for i in range(8):
        alone = LLMEngine(target, drafters["dspark"], EngineConfig(max_batch=1, cache_budget_bytes=2_000_000,
                                                                   page_size=8, max_model_len=72))
        one = alone.generate([prompts[i]], params[i])[0]
        assert one.token_ids == batched[i].token_ids


def test_streaming_yields_tokens_as_committed(target, drafters):
    engine = LLMEngine(target, drafters["dspark"], TIGHT)
    rid = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=25))
    other = engine.add_request(PROMPTS[1], SamplingParams(max_tokens=25))
    seq, other_seq = engine.seqs[rid], engine.seqs[other]
    chunks = list(engine.stream(rid))
    assert len(chunks) > 1 and sum(chunks, []) == seq.generated
    assert [len(c) for c in chunks[1:]] == seq.acceptance_lengths     # one chunk per verify step
    while not other_seq.is_finished:                                    # stepped alongside, then alone
        engine.step()
    solo = LLMEngine(engine.target, drafters["dspark"], TIGHT).generate([PROMPTS[1]], SamplingParams(max_tokens=25))
    assert other_seq.generated == solo[0].token_ids and len(other_seq.generated) == 25
    assert not engine.seqs                                              # both forgotten once finished


def test_prefix_cache_hits_change_nothing(target, drafters):
    shared = list(range(3, 43))                                   # 40-token common prefix
    first, second = shared + [50, 51], shared + [60, 61, 62]
    params = SamplingParams(max_tokens=20)

    def run(prefix_caching: bool):
        cfg = EngineConfig(max_batch=4, cache_budget_bytes=2_000_000, page_size=8, max_model_len=72,
                           prefix_caching=prefix_caching, adaptive_speculation=False)  # ALs compared: always draft
        engine = LLMEngine(target, drafters["dspark"], cfg)
        a = engine.generate([first], params)[0]
        b = engine.generate([second], params)[0]
        return engine, a, b

    cached, a1, b1 = run(True)
    plain, a0, b0 = run(False)
    assert cached.stats.prefix_hits >= 5 and plain.stats.prefix_hits == 0
    assert (a1.token_ids, b1.token_ids) == (a0.token_ids, b0.token_ids)
    assert (a1.acceptance_lengths, b1.acceptance_lengths) == (a0.acceptance_lengths, b0.acceptance_lengths)


def test_reused_blocks_never_match_stale_ids(target):
    """Fill the pool with other requests so cached blocks are reallocated, then ask again."""
    cfg = EngineConfig(max_batch=2, cache_budget_bytes=110_000, page_size=8, max_model_len=72)
    engine = LLMEngine(target, None, cfg)
    prompt = list(range(1, 41))
    ref = engine.generate([prompt], SamplingParams(max_tokens=8))[0].token_ids
    hits_before = engine.stats.prefix_hits
    assert engine.generate([prompt], SamplingParams(max_tokens=8))[0].token_ids == ref
    assert engine.stats.prefix_hits > hits_before, "the repeated prompt was meant to hit the prefix cache"
    for i in range(6):                                           # churn every block
        engine.generate([[(7 * i + j) % 120 for j in range(40)]], SamplingParams(max_tokens=20))
    again = engine.generate([prompt], SamplingParams(max_tokens=8))[0].token_ids
    assert again == ref
    for block, key in enumerate(engine.blocks.block_key):      # every registered block maps back to itself
        if key is not None and key[0] in engine.blocks.by_hash:
            assert engine.blocks.by_hash[key[0]] == block


def test_admission_errors_name_the_limits(target):
    engine = LLMEngine(target, None, TIGHT)
    with pytest.raises(RequestError, match="max_model_len=72"):
        engine.add_request(list(range(60)), SamplingParams(max_tokens=20))
    with pytest.raises(RequestError, match="already in use"):
        engine.add_request([1, 2], request_id="x")
        engine.add_request([1, 2], request_id="x")


def test_telemetry_counts(target, drafters):
    engine = LLMEngine(target, drafters["dflash2"], TIGHT)
    outs = engine.generate(PROMPTS[:6], SamplingParams(max_tokens=17))
    snap = engine.stats.snapshot()
    steps = sum(len(o.acceptance_lengths) for o in outs)
    assert snap["verify_steps"] == steps == sum(snap["al_histogram"].values())
    assert snap["generated"] == sum(len(o.token_ids) for o in outs)
    # a step cut by max_tokens keeps fewer tokens than accepted drafts + 1
    assert sum(sum(o.acceptance_lengths) - len(o.acceptance_lengths) for o in outs) <= snap["accepted"]
    assert snap["accepted"] <= sum(sum(o.acceptance_lengths) for o in outs) and snap["accepted"] <= snap["drafted"]
    assert len(snap["ttft_s"]) == 6 and snap["blocks_free"] == snap["blocks_total"]
    assert all(0 <= r <= 1 for r in snap["per_position_acceptance"])


def test_confidence_threshold_in_batch_is_lossless(target, drafters, single_stream):
    cfg = EngineConfig(max_batch=8, cache_budget_bytes=2_000_000, page_size=8, max_model_len=72,
                       confidence_threshold=0.8)
    outs = LLMEngine(target, drafters["dspark"], cfg).generate(PROMPTS[:10], PARAMS[:10])
    assert [o.token_ids for o in outs] == single_stream[:10]


def test_policy_skipping_drafts_keeps_greedy_output(target, drafters, single_stream):
    engine = LLMEngine(target, drafters["dflash"], TIGHT)
    record = engine.policy.record                                         # pretend drafting is very slow
    engine.policy.record = lambda batch, width, s, *counts, **kw: record(batch, width, s + 10.0 * (width > 0), *counts,
                                                                        **kw)
    engine.policy.min_gap = 10 ** 6
    outs = engine.generate(PROMPTS[:12], PARAMS[:12])
    assert [o.token_ids for o in outs] == single_stream[:12]
    spec = engine.stats.spec                                              # the widest's tries drafted, then
    assert 0 < spec.position_attempts[0] < spec.verify_steps / 2          # most sequence-steps did not


def test_sliding_window_drafter_uses_the_ring(target, drafters, single_stream):
    """dflash-sliding: layer 0 windowed (ring of window + block rows), layer 1 full (paged mirror)."""
    engine = LLMEngine(target, drafters["dflash-sliding"], TIGHT)
    assert engine.runner.ring is not None and sorted(engine.runner.ring.k) == [0]
    assert sorted(engine.runner.drafter_pool.k) == [1]
    outs = engine.generate(PROMPTS[:16], PARAMS[:16])
    assert [o.token_ids for o in outs] == single_stream[:16]
    assert engine.stats.spec.accepted > 0
    assert sorted(engine.runner.ring.free_rows) == list(range(TIGHT.max_batch))
    assert engine.blocks.num_free == engine.plan.num_blocks


def test_ring_acceptance_matches_single_stream(target, drafters):
    """Same drafts as the full-context single-stream loop: the ring loses nothing inside the window."""
    from decode_oracle import generate_one

    cfg = EngineConfig(max_batch=1, cache_budget_bytes=2_000_000, page_size=8, max_model_len=72,
                       adaptive_speculation=False)
    engine = LLMEngine(target, drafters["dflash-sliding"], cfg)
    for prompt in PROMPTS[:6]:
        params = SamplingParams(max_tokens=30)
        ref = generate_one(target, prompt, params, drafters["dflash-sliding"])
        out = engine.generate([prompt], params)[0]
        assert out.token_ids == ref.token_ids and out.acceptance_lengths == ref.acceptance_lengths


def test_step_alone_does_not_keep_finished_requests(target, drafters):
    """A long-running caller of step()/stream() must not grow memory: finished requests are dropped
    from the engine once their final output has been returned."""
    engine = LLMEngine(target, drafters["dspark"], TIGHT)
    finals = {}
    for round_ in range(3):
        rids = [engine.add_request(p, SamplingParams(max_tokens=10)) for p in PROMPTS[:4]]
        while engine.has_unfinished():
            finals.update((o.request_id, o) for o in engine.step() if o.finished)
        assert not engine.seqs, f"round {round_}: {len(engine.seqs)} finished requests still held"
        assert all(finals[r].finished and len(finals[r].token_ids) == 10 for r in rids)
    rid = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=10))
    chunks = list(engine.stream(rid))
    assert sum(chunks, []) == finals["req-0"].token_ids and not engine.seqs
    victim = engine.add_request(PROMPTS[1], SamplingParams(max_tokens=10))
    engine.abort(victim)
    assert not engine.seqs and engine.blocks.num_free == engine.plan.num_blocks


@pytest.mark.skipif(not kernels.available(), reason="no C compiler: the layers run unfused")
def test_lone_rows_address_pass_under_arrivals_and_preemption_matches_single_stream():
    """A quantized target whose lone decoding rows take the address pass (`TargetModel.fused_row`, slots kept
    per sequence): sequences that run alone between batched steps, under arrivals and preemption, give
    single-stream decoding's tokens (the kept slots' re-reading of a changed table: tests/cache/test_paged.py)."""
    from blockdraft.models.target import TargetModel
    from tiny_models import row_pass_target
    target = row_pass_target()
    served, row = [], TargetModel.fused_row

    def counted(self, *args):
        served.append(row(self, *args))
        return served[-1]

    engine = LLMEngine(target, None, TIGHT)
    want = [generate_one(target, p, sp).token_ids for p, sp in zip(PROMPTS[:16], PARAMS[:16])]
    rng, pending, ids, outs = random.Random(5), list(range(16)), {}, {}
    TargetModel.fused_row = counted
    try:
        while pending or engine.has_unfinished():
            for _ in range(rng.choice([0, 0, 0, 1, 4])):
                if pending:
                    i = pending.pop()
                    ids[engine.add_request(PROMPTS[i], PARAMS[i])] = i
            outs.update((o.request_id, o.token_ids) for o in engine.step() if o.finished)
    finally:
        TargetModel.fused_row = row
    assert engine.stats.preemptions > 0 and sum(out is not None for out in served) >= 10
    assert {rid: want[i] for rid, i in ids.items()} == outs
