"""The per-step thread count (engine/threads.py): the faster of the process's count and one, with a
periodic look at the other; output identical whichever runs."""

import torch

import blockdraft
from blockdraft.engine.threads import RECENT, ThreadChoice
from conftest import ASSETS, on_threads


def test_picks_the_faster_count_and_follows_a_change():
    choice, key = ThreadChoice(most=2, every=4, share=0.5), (1, 0)
    assert choice.pick(key) == 2
    choice.record(key, 2, 1.0)
    assert choice.pick(key) == 1                     # each count measured once first
    choice.record(key, 1, 0.5)
    picks = [choice.pick(key) for _ in range(8)]      # steps 3..10: the faster, and every 4th the other
    assert picks == [1, 2, 1, 1, 1, 2, 1, 1]
    for _ in range(3):                                # one thread slows down (the other core got busy)
        choice.record(key, 1, 4.0)
    assert choice.pick(key) == 2
    assert choice.pick((8, 3)) == 2                   # another bucket or width is measured on its own
    far = ThreadChoice(most=2, every=4, share=0.5)    # the other count measured 5x slower: looks are rarer
    far.record(key, 2, 5.0)
    far.record(key, 1, 1.0)
    picks = [far.pick(key) for _ in range(16)]
    assert picks.count(2) == 2 and picks.index(2) == 7   # every max(4, (5 - 1) / 0.5) = 8 steps


def test_a_pick_says_whether_it_only_measures_the_other_count():
    """`looks_at`: the step runs at a count other than the one the choice runs (a first measurement of it, or a
    periodic look), so its time is not what the step costs (the width policy leaves it out)."""
    choice, key = ThreadChoice(most=2, every=4, share=0.5), (1, 0)
    flags = []
    for _ in range(8):                                   # two threads 1.0 s a step, one 0.5 s: one runs
        threads = choice.pick(key)
        flags.append((threads, choice.looks_at(threads)))
        choice.record(key, threads, 0.5 if threads == 1 else 1.0)
    assert flags == [(2, False), (1, True), (1, False), (2, True), (1, False), (1, False), (1, False), (2, True)]
    new = (1, 3)                                         # a new width: the count it runs now, then the other
    assert (threads := choice.pick(new), choice.looks_at(threads)) == (1, False)
    choice.record(new, 1, 0.5)
    assert (threads := choice.pick(new), choice.looks_at(threads)) == (2, True)
    single = ThreadChoice(most=1)
    assert single.pick(key) == 1 and not single.looks_at(1)


def test_one_delayed_step_does_not_move_the_choice():
    """A step the host delayed (a barrier waiting on a descheduled thread) is not the count's cost: the
    choice stays until most of the count's last RECENT steps are slower."""
    choice, key = ThreadChoice(most=2, every=1000, share=0.01), (1, 0)
    choice.record(key, 2, 1.0)
    choice.record(key, 1, 1.8)
    for _ in range(RECENT):
        choice.record(key, 2, 1.0)
    choice.record(key, 2, 10.0)                       # one step 10x slower
    assert [choice.pick(key) for _ in range(5)] == [2] * 5
    for _ in range(RECENT // 2):
        choice.record(key, 2, 10.0)
    assert choice.pick(key) == 1                      # most of the last RECENT steps: the count got slower


def test_a_single_thread_process_is_left_alone():
    choice = ThreadChoice(most=1)
    assert [choice.pick((1, 0)) for _ in range(5)] == [1] * 5
    assert ThreadChoice(most=4, enabled=False).pick((1, 0)) == 4


def test_output_is_the_same_whichever_count_runs():
    """Greedy and seeded requests give the same tokens with the choice on (both counts run) and on
    one thread; the process's thread count is what it was after each step."""
    prompts = [[3, 17, 42, 5, 9], [8, 1, 77, 23]]
    params = [blockdraft.SamplingParams(max_tokens=24, ignore_eos=True),
              blockdraft.SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, seed=7)]

    def tokens(threads: int) -> list[list[int]]:
        llm = blockdraft.LLM(target=str(ASSETS / "target-qwen3"), drafter=str(ASSETS / "dspark"), max_batch=2)
        llm.engine.threads.every = 2
        out = [o.token_ids for p in params for o in llm.generate(prompt_token_ids=prompts, sampling_params=p)]
        assert torch.get_num_threads() == threads
        if threads == 2:
            assert {t for (*_, t) in llm.engine.threads.cost} == {1, 2}
        return out

    assert on_threads(2, lambda: tokens(2)) == on_threads(1, lambda: tokens(1))
