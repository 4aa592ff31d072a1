"""Draft width from measured cost: the width that commits the most tokens per second wins."""

import pytest

from blockdraft.engine.engine import EngineConfig, LLMEngine
from blockdraft.engine.policy import WIDE_TRIES, DraftWidthPolicy
from blockdraft.errors import ConfigError
from blockdraft.sampling.params import SamplingParams
from conftest import on_threads, random_prompts


def _measure(policy, batch, cost_of, accepted_of):
    """Run the policy's exploration to the end with a synthetic machine and drafter."""
    for _ in range(len(policy.widths) + WIDE_TRIES):
        w = policy.choose(batch)
        policy.record(batch, w, cost_of(w), [w] * batch, [accepted_of(w)] * batch)


def test_tries_plain_then_the_widest_then_only_widths_that_could_win():
    policy = DraftWidthPolicy(8, min_gap=1000)
    assert policy.widths == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    seen = []
    for _ in range(6):                       # drafts never accepted, each verify row dear: plain wins
        seen.append(policy.choose(1))
        policy.record(1, seen[-1], 1.0 + 0.5 * seen[-1], [seen[-1]], [0])
    assert seen == [0] + [8] * WIDE_TRIES + [0] * (5 - WIDE_TRIES)
    mid = DraftWidthPolicy(8, min_gap=1000)      # acceptance decays, each verify row costs 10%
    cost = {w: 1.0 + (0.1 * w + 0.1 if w else 0.0) for w in mid.widths}
    for w in (0,) + (8,) * WIDE_TRIES:
        assert mid.choose(1) == w
        mid.record(1, w, cost[w], [w], [0])
    mid.trials[1:], mid.hits[1:] = [1000] * 8, [900, 700, 400, 200, 100, 50, 20, 10]
    truth = {w: mid.expected_tokens(w) / cost[w] for w in mid.widths}
    picks = []
    for _ in range(10):
        w = mid.choose(1)
        picks.append(w)
        mid.record(1, w, cost[w], [], [])
    assert picks[-1] == max(truth, key=truth.get) not in (0, 8)    # the knee, found ...
    assert len(set(picks) | {0, 8}) < 9                            # ... without trying every width


def test_dear_verify_and_weak_drafts_decode_plainly():
    policy = DraftWidthPolicy(8, min_gap=1000)
    _measure(policy, 1, cost_of=lambda w: 1.0 + 0.5 * w, accepted_of=lambda w: min(w, 1) if w else 0)
    policy.trials[1:], policy.hits[1:] = [100] * 8, [30] + [0] * 7       # 30% first-slot acceptance
    assert policy.choose(1) == 0


def test_cheap_verify_and_strong_drafts_go_wide():
    policy = DraftWidthPolicy(8, min_gap=1000)
    _measure(policy, 1, cost_of=lambda w: 1.0 + (0.3 if w else 0.0), accepted_of=lambda w: w)
    assert policy.choose(1) == 8
    # a middle ground: verify rows cost, acceptance decays -> an interior width
    mid = DraftWidthPolicy(8, min_gap=1000)
    _measure(mid, 1, cost_of=lambda w: 1.0 + 0.2 * w, accepted_of=lambda w: 0)
    mid.trials[1:], mid.hits[1:] = [1000] * 8, [900, 700, 400, 200, 100, 50, 20, 10]
    rates = {w: mid.expected_tokens(w) / mid._cost(1, w) for w in mid.widths}      # measured or interpolated
    assert mid.choose(1) == max(rates, key=rates.get) not in (0, 8)


def test_a_new_bucket_starts_plain_and_scales_what_others_measured():
    policy = DraftWidthPolicy(4, min_gap=1000)
    _measure(policy, 8, cost_of=lambda w: 2.0 * (1.0 + w), accepted_of=lambda w: 0)   # drafting loses at 8
    assert policy.choose(16) == 0                           # another bucket: a plain step first ...
    policy.record(16, 0, 4.0, [], [])
    assert policy._cost(16, 3) == 4.0 * 8.0 / 2.0           # ... then bucket 8's relative costs, scaled
    assert all(policy.choose(16) == 0 for _ in range(5))    # so the widest is not tried again
    assert policy.bucket(5) == policy.bucket(8) == 8
    off = DraftWidthPolicy(4, enabled=False)
    off.record(1, 4, 100.0, [4], [0])
    assert off.widths == [4] and all(off.choose(1) == 4 for _ in range(5))
    with pytest.raises(ConfigError, match="num_speculative_tokens must be >= 0"):
        EngineConfig(num_speculative_tokens=-1)


def test_looks_cost_at_most_their_share_of_decoding_time():
    """A drafter that cannot pay: the looks at its narrowest and widest widths lose at most `explore_share`
    of the time against decoding plainly throughout, and are at least `min_gap` steps apart."""
    policy = DraftWidthPolicy(4, explore_share=0.03, min_gap=16)
    cost = {w: 1.0 + 0.5 * w for w in policy.widths}
    spent, picks = 0.0, []
    for _ in range(2000):
        w = policy.choose(8)
        picks.append(w)
        spent += cost[w]
        policy.record(8, w, cost[w], [w] * 8, [0] * 8)
    first = 1 + WIDE_TRIES                                      # the first plain step, the widest's tries
    assert picks[1:first] == [4] * WIDE_TRIES
    looks = [i for i, w in enumerate(picks) if w and i >= first]
    assert set(picks[first:]) == {0, 1, 4} and len(looks) > 10
    assert min(b - a for a, b in zip(looks, looks[1:])) >= 16
    assert spent - 2000 * cost[0] <= 0.03 * spent + WIDE_TRIES * cost[4]     # the widest's tries, plus the share


def test_a_drafter_that_starts_to_accept_is_found_by_the_looks():
    policy = DraftWidthPolicy(4, min_gap=8)
    cost = {w: 1.0 + 0.1 * w for w in policy.widths}
    accepting = False
    picks = []
    for step in range(1500):
        accepting = step >= 300                   # drafts rejected at first, then always accepted
        picks.append(policy.choose(1))
        w = picks[-1]
        policy.record(1, w, cost[w], [w], [w if accepting else 0])
    assert set(picks[10:300]) == {0, 1, 4} and picks[250:300].count(0) > 40    # plain, with rare looks
    assert picks[400:].count(4) > 0.8 * len(picks[400:])                  # then the widest wins


def test_policy_never_changes_greedy_or_seeded_output(target, drafters):
    """Greedy rows follow the width policy, sampled rows draft full width: outputs equal a
    fixed-width engine's, and the cap is honoured."""
    prompts = random_prompts(6, seed=3)
    params = [SamplingParams(max_tokens=24)] * 3 + [SamplingParams(max_tokens=24, temperature=0.8, seed=i)
                                                     for i in range(3)]
    cfg = dict(max_batch=6, cache_budget_bytes=2_000_000, page_size=8, max_model_len=72)
    fixed = LLMEngine(target, drafters["dspark"], EngineConfig(**cfg, adaptive_speculation=False))
    adaptive = LLMEngine(target, drafters["dspark"], EngineConfig(**cfg))
    adaptive.policy.min_gap, adaptive.policy.explore_share = 2, 1.0     # exercise many widths within 24 tokens
    ref, got = fixed.generate(prompts, params), adaptive.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert len({w for (_, w) in adaptive.policy.cost}) > 2
    capped = LLMEngine(target, drafters["dspark"], EngineConfig(**cfg, num_speculative_tokens=2))
    outs = capped.generate(prompts, params)
    assert [o.token_ids for o in outs[:3]] == [o.token_ids for o in ref[:3]]
    assert max(a for o in outs for a in o.acceptance_lengths) <= 3 and capped.policy.widths == [0, 1, 2]


def test_measurements_persist_and_a_new_engine_starts_from_them(target, drafters, tmp_path, caplog):
    """An engine with a policy file writes what its policy measured; the next one starts from it
    (no exploration of the ends), and a file that does not fit is ignored with a warning."""
    path = tmp_path / "policy.json"
    cfg = dict(max_batch=2, cache_budget_bytes=2_000_000, page_size=8, max_model_len=72, policy_file=str(path))
    first = LLMEngine(target, drafters["dspark"], EngineConfig(**cfg))
    ref = first.generate(random_prompts(2, seed=5), SamplingParams(max_tokens=16))
    assert path.is_file() and first.policy.cost
    second = LLMEngine(target, drafters["dspark"], EngineConfig(**cfg))
    assert second.policy.cost == first.policy.cost
    assert second.policy.trials[1] == min(first.policy.trials[1], 256)
    got = second.generate(random_prompts(2, seed=5), SamplingParams(max_tokens=16))
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    narrow = DraftWidthPolicy(2)
    assert not narrow.restore(first.policy.state())                  # another width: not restored
    path.write_text("{not json")
    with caplog.at_level("WARNING"):
        third = LLMEngine(target, drafters["dspark"], EngineConfig(**cfg))
    assert not third.policy.cost and "width policy" in caplog.text
    assert third.generate(random_prompts(1, seed=6), SamplingParams(max_tokens=4))[0].finished


def test_restore_keeps_the_policy_choosing_without_exploring_again():
    measured = DraftWidthPolicy(8, min_gap=1000)
    _measure(measured, 1, lambda w: 1.0 + 0.5 * w, lambda w: 0)      # plain decoding wins
    fresh = DraftWidthPolicy(8, min_gap=1000)
    assert fresh.restore(measured.state())
    assert [fresh.choose(1) for _ in range(3)] == [0, 0, 0]           # neither plain nor the widest again
    assert [fresh.choose(2) for _ in range(3)] == [0, 0, 0]           # another bucket: scaled, not explored
    bad = measured.state() | {"hits": [5] * 9, "trials": [1] * 9}    # more hits than trials
    assert not DraftWidthPolicy(8).restore(bad)


def test_a_plain_cost_measured_in_a_slow_spell_does_not_keep_drafting():
    """While a width drafts, plain steps are looked at too: a plain cost measured once while the machine
    was slow (so drafting looked cheaper than it is) is refreshed, and plain decoding wins again."""
    policy = DraftWidthPolicy(4)
    policy.trials[1:], policy.hits[1:] = [100] * 4, [30, 10, 3, 1]           # E(3) ~ 1.4
    policy.cost = {(1, 0): 3.0, (1, 1): 1.6, (1, 2): 1.7, (1, 3): 1.8, (1, 4): 1.9}   # plain measured slow
    true_cost = {0: 1.0, 1: 1.6, 2: 1.7, 3: 1.8, 4: 1.9}
    picks = []
    for _ in range(600):
        w = policy.choose(1)
        picks.append(w)
        policy.record(1, w, true_cost[w], [], [])
    assert picks[0] != 0 and 0 in picks[:200] and picks[-100:].count(0) > 90   # plain again, with rare looks


def test_a_stored_plain_cost_far_dearer_than_drafting_is_lowered_and_refreshed():
    """A persisted state whose plain step was timed ~70x too slow (one was: 0.90 s against 0.013 s for a
    drafting step of width 8) must not keep a weak drafter drafting in every later process."""
    stored = {"max_width": 8, "cost": [[1, 0, 0.8987], [1, 4, 1.3072], [1, 8, 0.01297]],
              "trials": [0, 353, 350, 346, 346, 341, 338, 334, 331], "hits": [0, 110, 3, 0, 0, 0, 0, 0, 0]}
    policy = DraftWidthPolicy(8)
    assert policy.restore(stored)
    assert policy.cost[(1, 0)] <= policy.cost[(1, 8)] and policy.cost[(1, 4)] <= policy.cost[(1, 8)]
    true_cost = {w: 0.0044 + 0.0011 * w + (0.003 if w else 0.0) for w in policy.widths}
    picks = []
    for _ in range(400):
        w = policy.choose(1)
        picks.append(w)
        policy.record(1, w, true_cost[w], [w], [min(w, 1) if w else 0])
    assert picks[-100:].count(0) > 90, picks[-100:]


def test_measured_costs_never_fall_with_width():
    policy = DraftWidthPolicy(8)
    policy.record(1, 8, 0.010, [], [])
    policy.record(1, 0, 0.050, [], [])            # slower than the wider step: capped at its cost
    policy.record(1, 4, 0.020, [], [])
    assert [policy.cost[(1, w)] for w in (0, 4, 8)] == [0.010, 0.010, 0.010]
    policy.record(1, 0, 0.004, [], [])
    assert policy.cost[(1, 0)] == 0.007           # halfway down, as any lower sample moves it


def test_a_slow_spell_of_plain_steps_does_not_make_a_weak_drafter_draft():
    """A plain step's estimate raised by slow steps (and capped at width 1's cost) is not what drafting must
    beat: the lowest of the recent plain steps is. A drafter that gains 11% at 1.4x a step stays off; one
    that gains 90% at 1.2x still drafts."""
    def policy_after_spell(hits: int, width1_cost: float) -> DraftWidthPolicy:
        policy = DraftWidthPolicy(8, min_gap=1000)
        _measure(policy, 1, cost_of=lambda w: 1.0 if w == 0 else width1_cost + 0.3 * (w - 1), accepted_of=lambda w: 0)
        policy.trials[1:], policy.hits[1:] = [1000] * 8, [hits] + [0] * 7
        policy.record(1, 1, width1_cost, [], [])
        for _ in range(10):
            policy.record(1, 0, 1.0, [], [])
        for _ in range(6):                                 # the slow spell
            policy.record(1, 0, 1.8, [], [])
        assert policy.cost[(1, 0)] == policy.cost[(1, 1)] == width1_cost   # raised, then capped at width 1
        return policy
    assert policy_after_spell(hits=110, width1_cost=1.4).choose(1) == 0
    assert policy_after_spell(hits=900, width1_cost=1.2).choose(1) != 0


def test_the_widest_widths_measuring_steps_keep_their_cheapest_cost():
    """The first drafting step pays one-time costs and the thread choice may time another count on the next:
    the tries keep their cheapest cost, so a drafter that pays is drafted at once; later steps move it as usual."""
    policy = DraftWidthPolicy(8, min_gap=1000)
    warm = {w: 1.0 + 0.12 * w + (0.3 if w else 0.0) for w in policy.widths}   # width 8: 2.26 plain steps
    policy.record(1, policy.choose(1), warm[0], [], [])
    for slow in (1.4, 1.7, 1.0):                                             # as measured: 146, 174, 104 ms
        assert policy.choose(1) == 8
        policy.record(1, 8, warm[8] * slow, [8], [3])
    assert policy.cost[(1, 8)] == warm[8]
    assert policy.choose(1) != 0                 # 4 tokens a step for 2.26: drafting, not plain steps
    policy.record(1, 8, 2 * warm[8], [8], [3])
    assert policy.cost[(1, 8)] == pytest.approx(1.25 * warm[8])             # a slower step moves it a quarter


def test_while_plain_the_looks_also_measure_the_deep_slots():
    """Measuring steps that saw no draft accepted leave the deep slots' estimates low, and a drafting step's
    fixed cost keeps width 1 from paying: looks at width 1 measure slot 1 alone, and the deep slots' estimates,
    which follow the slot before them until measured, then make a deep width worth a step, or a look at the
    widest finds it: the deep widths pay (here 2.8 tokens a step for 1.8 plain steps' time)."""
    policy = DraftWidthPolicy(8, min_gap=8)
    cost = {w: 1.0 + (0.6 + 0.05 * w if w else 0.0) for w in policy.widths}
    pattern = [0, 0, 2, 3, 4]                                              # accepted of 8: P(slot 1) 0.6, mean 1.8
    picks = []
    for step in range(600):
        w = picks.append(policy.choose(1)) or picks[-1]
        accepted = 0 if step <= WIDE_TRIES else min(w, pattern[step % len(pattern)])
        policy.record(1, w, cost[w], [w], [accepted])
    assert picks[1:1 + WIDE_TRIES] == [8] * WIDE_TRIES and picks[5:20] == [0] * 15    # width 1 measured: plain
    assert any(w >= 4 for w in picks[1 + WIDE_TRIES:200])                  # a deep width tried ...
    assert sum(w >= 4 for w in picks[400:]) > 0.8 * 200                    # ... and the wide widths win


def simulate(policy: DraftWidthPolicy, steps: int, upkeep_per_plain_step: float, accepted: int) -> tuple[float, int]:
    """Tokens per second of a synthetic machine (a plain step 1.0, each verify row 0.25) and drafter (the first
    `accepted` drafts kept) whose context costs `upkeep_per_plain_step` for each plain step, written at the next
    drafting step as the runner does; and how many steps drafted."""
    cost = {w: 1.0 + 0.25 * w for w in policy.widths}
    seconds = tokens = 0.0
    owed = drafting = 0
    for _ in range(steps):
        w = policy.choose(1)
        upkeep = owed * upkeep_per_plain_step if w else 0.0
        owed, drafting = (0, drafting + 1) if w else (owed + 1, drafting)
        policy.record(1, w, cost[w], [w], [min(w, accepted)], upkeep)
        seconds += cost[w] + upkeep
        tokens += 1 + min(w, accepted)
    return tokens / seconds, drafting


def test_a_look_from_plain_counts_the_drafter_context_it_must_write_first():
    """A drafter that never pays, whose context costs 5% of a plain step for each plain step it missed: its
    looks and their context together stay within the look budget;
    a cheap context leaves the looks as they were, and a paying drafter still drafts."""
    rate, looks = simulate(DraftWidthPolicy(8), 20000, 0.05, 0)
    assert rate >= 0.99 and looks < 10
    assert simulate(DraftWidthPolicy(8), 20000, 0.0, 0)[1] > 100
    rate, drafting = simulate(DraftWidthPolicy(8), 20000, 0.05, 8)
    assert rate > 2.9 and drafting > 19000
    measured = DraftWidthPolicy(8)
    simulate(measured, 2000, 0.05, 0)
    kept = DraftWidthPolicy(8)
    assert kept.restore(measured.state()) and kept.upkeep == measured.upkeep == {1: pytest.approx(0.05)}


def test_unlucky_first_samples_of_the_deep_slots_do_not_keep_the_policy_narrow():
    """Each slot accepted with probability 0.75 (at random), verify rows each 8% of a plain step beside a drafting
    step's fixed 35%: widths 5-7 commit the most tokens a second. The widest width's measuring steps happen to
    see slot 3 and beyond rejected; the policy, drafting narrower, learns the deep slots only from its own steps
    and looks, yet settles within 3% of the best width's rate."""
    import random

    rng = random.Random(5)
    policy = DraftWidthPolicy(8, min_gap=32)
    cost = {w: 1.0 + (0.35 + 0.08 * w if w else 0.0) for w in policy.widths}
    rate = {w: (1 - 0.75 ** (w + 1)) / 0.25 / cost[w] for w in policy.widths}
    unlucky = iter([1, 2, 0])
    picks = []
    for step in range(600):
        w = policy.choose(1)
        picks.append(w)
        if w == 8 and step <= WIDE_TRIES:
            accepted = next(unlucky)
        else:
            accepted = next((i for i in range(w) if rng.random() >= 0.75), w)
        policy.record(1, w, cost[w], [w], [accepted])
    assert picks[1:1 + WIDE_TRIES] == [8] * WIDE_TRIES
    late = picks[300:]
    assert sum(rate[w] for w in late) / len(late) >= 0.97 * max(rate.values())


def test_a_step_at_a_thread_count_being_measured_is_not_the_widths_cost():
    """The engine runs a width's step at the other thread count now and then to measure it (threads.py); that
    step's time (a one-thread step: ~1.8x) is left out of the width's cost, and its acceptance still counts."""
    policy = DraftWidthPolicy(8, min_gap=1000)
    policy.record(1, 0, 1.0, [], [])
    policy.record(1, 4, 1.5, [4], [2])
    policy.record(1, 4, 2.7, [4], [4], timed=False)
    assert policy.cost[(1, 4)] == 1.5 and policy.trials[4] == 2 and policy.hits[4] == 1 and policy.hits[2] == 2
    policy.record(1, 4, 2.7, [4], [0])
    assert policy.cost[(1, 4)] == pytest.approx(1.5 + 0.25 * 1.2)        # a timed slower step moves it a quarter


def test_the_engine_leaves_thread_looks_out_of_the_widths_costs(target, drafters):
    """End to end: every step the engine ran at a thread count it was only measuring reaches the policy untimed."""
    def run():
        engine = LLMEngine(target, drafters["dspark"], EngineConfig(max_batch=1))
        engine.threads.every = 2
        seen, looks = [], []
        record, pick = engine.policy.record, engine.threads.pick
        engine.policy.record = lambda *a, **k: seen.append(k["timed"]) or record(*a, **k)
        engine.threads.pick = lambda key: (n := pick(key), looks.append(engine.threads.looks_at(n)))[0]
        engine.generate([[3, 17, 42, 5, 9]], SamplingParams(max_tokens=24, ignore_eos=True))
        return seen, looks

    seen, looks = on_threads(2, run)
    assert any(looks) and seen == [not look for look in looks]
