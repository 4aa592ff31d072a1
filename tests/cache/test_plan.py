"""Capacity planning: never over budget, never under-bills the drafter, refuses what cannot work."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockdraft.cache.plan import INT64_MAX, KVGeometry, plan_cache
from blockdraft.errors import ConfigError

geometries = st.builds(KVGeometry, st.integers(1, 80), st.integers(1, 16), st.sampled_from([32, 64, 128, 256]),
                       st.sampled_from([1, 2, 4]))


@settings(max_examples=300, deadline=None)
@given(target=geometries, drafter=st.none() | geometries, window=st.none() | st.integers(1, 4096),
       budget=st.integers(1, 2**50), page_size=st.sampled_from([1, 8, 16, 32, 64]),
       max_batch=st.integers(1, 256), blocks_per_seq=st.integers(1, 64), lookahead=st.integers(0, 16),
       drafter_block=st.integers(2, 16))
def test_plan_within_budget_and_bills_drafter(target, drafter, window, budget, page_size, max_batch,
                                              blocks_per_seq, lookahead, drafter_block):
    max_len = blocks_per_seq * page_size
    window = window if drafter is not None else None
    try:
        plan = plan_cache(budget, page_size, max_batch, max_len, lookahead, target, drafter, window, drafter_block)
    except ConfigError:
        return
    assert plan.total_bytes <= budget
    assert plan.num_blocks * plan.page_size >= max_len + lookahead        # one max-length sequence fits
    if drafter is not None and window is None:
        # every target block carries a drafter block, plus one query-spill block per batch row
        assert plan.drafter_bytes_per_block == drafter.bytes_per_token * page_size
        assert plan.spill_bytes == max_batch * plan.drafter_bytes_per_block
        assert plan.total_bytes == plan.spill_bytes + plan.num_blocks * (
            plan.target_bytes_per_block + plan.drafter_bytes_per_block)
        # and no more target blocks could have been afforded
        assert plan.total_bytes + plan.target_bytes_per_block + plan.drafter_bytes_per_block > budget
    elif drafter is not None:
        assert plan.spill_bytes == max_batch * (window + drafter_block) * drafter.bytes_per_token
    else:
        assert plan.spill_bytes == 0


TARGET = KVGeometry(30, 3, 64, 2)
DRAFTER = KVGeometry(2, 3, 64, 2)


def test_mixed_drafter_bills_both_parts():
    ring = KVGeometry(1, 3, 64, 2)
    plan = plan_cache(2**30, 16, 4, 1024, 8, TARGET, DRAFTER, drafter_window=64, drafter_block_size=8,
                      drafter_ring=ring)
    assert plan.spill_bytes == 4 * DRAFTER.bytes_per_token * 16 + 4 * (64 + 8) * ring.bytes_per_token
    assert plan.total_bytes == plan.spill_bytes + plan.num_blocks * (plan.target_bytes_per_block
                                                                     + plan.drafter_bytes_per_block)


def test_exact_fit_and_one_byte_short():
    bpb = TARGET.bytes_per_token * 16 + DRAFTER.bytes_per_token * 16
    spill = 4 * DRAFTER.bytes_per_token * 16
    needed_blocks = 2048 // 16 + 1                     # max_model_len 2048 + lookahead 8
    budget = spill + needed_blocks * bpb
    assert plan_cache(budget, 16, 4, 2048, 8, TARGET, DRAFTER).num_blocks == needed_blocks
    with pytest.raises(ConfigError, match="needs 129"):
        plan_cache(budget - 1, 16, 4, 2048, 8, TARGET, DRAFTER)


def test_near_integer_limits():
    plan = plan_cache(INT64_MAX, 16, 8, 1024, 8, TARGET, DRAFTER)
    assert plan.total_bytes <= INT64_MAX and plan.num_blocks > 0
    with pytest.raises(ConfigError, match="absurdly large"):
        plan_cache(INT64_MAX + 1, 16, 8, 1024, 8, TARGET, DRAFTER)
    with pytest.raises(ConfigError, match="absurdly large"):
        plan_cache(2**40, 16, 2**64, 1024, 8, TARGET, DRAFTER)


@pytest.mark.parametrize("kwargs,message", [
    (dict(budget_bytes=0), "budget_bytes must be > 0"),
    (dict(budget_bytes=-5), "budget_bytes must be > 0"),
    (dict(page_size=0), "page_size must be > 0"),
    (dict(page_size=24), "page_size=24 does not divide max_model_len=1024"),
    (dict(max_batch=0), "max_batch must be > 0"),
    (dict(lookahead=-1), "lookahead must be >= 0"),
    (dict(budget_bytes=1000), "drafter reserve"),
    (dict(budget_bytes=10**6), "needs 65"),
    (dict(page_size=16.0), "page_size must be an integer"),
])
def test_refusals(kwargs, message):
    args = dict(budget_bytes=2**30, page_size=16, max_batch=8, max_model_len=1024, lookahead=8,
                target=TARGET, drafter=DRAFTER)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        plan_cache(**args)
