"""Stop strings, checked on the last characters only, against the rule spelled out on the whole text."""

import random

import pytest

from blockdraft.default_model import smollm2_dir
from blockdraft.sampling.stops import StopCriteria
from blockdraft.tokenizer import Tokenizer


def whole_text_stop(tokens: list[int], stops: tuple[str, ...], decode) -> tuple[int, str] | None:
    """The first i whose text tokens[:i + 1] holds a stop string."""
    for i in range(len(tokens)):
        if any(s in decode(tokens[:i + 1]) for s in stops):
            return i + 1, "stop"
    return None


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(smollm2_dir())


@pytest.mark.parametrize("seed", range(12))
def test_stop_strings_found_where_the_whole_text_first_holds_them(tokenizer, seed):
    """Random ids (multi-byte characters cut across tokens, special tokens, runs of spaces), stop strings cut
    from their own text or made up, checked token by token as the scheduler does: the same cut as looking
    in the whole text each time."""
    rng = random.Random(seed)
    pool = list(range(tokenizer.vocab_size)) + list(range(17)) * 800     # ids 0..16: special, decoded as nothing
    tokens = [rng.choice(pool) for _ in range(rng.randint(20, 120))]
    text = tokenizer.decode(tokens)
    a = rng.randint(0, max(0, len(text) - 2))
    stops = (text[a:a + rng.randint(1, 12)] or "x", "".join(rng.choice("ab \\n") for _ in range(3)))
    want = whole_text_stop(tokens, stops, tokenizer.decode)
    crit = StopCriteria(frozenset(), stops, tokenizer.decode)
    got, start = None, 0
    while got is None and start < len(tokens):
        step = rng.randint(1, 9)                        # a step commits 1..9 tokens (accepted drafts + bonus)
        got = crit.first_stop(tokens[:start + step], start)
        start += step
    assert got == want


def test_a_long_generation_decodes_only_its_last_tokens():
    calls = []

    def decode(ids):
        calls.append(len(ids))
        return "".join(chr(97 + i % 26) for i in ids)

    crit = StopCriteria(frozenset(), ("zzzz",), decode)
    assert crit.first_stop(list(range(5000)), 4999) is None
    assert max(calls) < 64
