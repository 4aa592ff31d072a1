"""The adaptive speculation policy: measured costs decide, greedy output never changes."""

from blockdraft.engine.policy import SpeculationPolicy


def test_explores_both_modes_then_picks_the_cheaper_per_token():
    policy = SpeculationPolicy(explore_every=1000)
    assert policy.should_draft(8)                        # nothing measured: draft
    policy.record(True, 8, seconds=3.0, tokens_per_seq=2.0)
    assert not policy.should_draft(8)                    # measure the plain step once
    policy.record(False, 8, seconds=1.0, tokens_per_seq=1.0)
    assert not policy.should_draft(8)                    # 2 tokens / 3 s < 1 token / 1 s
    policy.record(True, 8, seconds=1.2, tokens_per_seq=4.0)
    policy.cost[(True, 8)] = 1.2
    assert policy.should_draft(8)                        # now drafting pays
    assert policy.should_draft(16)                       # other batch sizes are measured separately
    assert policy.should_draft(7)                        # 5..8 share the batch-8 estimate (drafting pays)


def test_periodic_exploration_and_off_switch():
    policy = SpeculationPolicy(explore_every=4)
    policy.record(True, 2, 3.0, 1.0)
    policy.record(False, 2, 1.0, 1.0)
    choices = [policy.should_draft(2) for _ in range(8)]
    assert choices.count(True) == 2                      # steps 4 and 8 re-explore drafting
    off = SpeculationPolicy(enabled=False)
    off.record(True, 2, 100.0, 1.0)
    off.record(False, 2, 1.0, 1.0)
    assert off.should_draft(2)
