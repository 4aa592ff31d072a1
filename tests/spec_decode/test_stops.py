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


def whole_text_deltas(decode, stops, steps: list[list[int]]) -> list[str]:
    """TextStream's deltas with the whole text decoded at every step (the rule it keeps)."""
    sent, hold, out = "", max((len(s) for s in stops), default=1) - 1, []
    for i, ids in enumerate(steps):
        final = i == len(steps) - 1
        text = decode(ids)
        for s in stops:
            if s in text:
                text = text[: text.index(s)]
        if not final and hold:
            text = text[: max(len(sent), len(text) - hold)]
        if text.endswith("\ufffd") and not final:
            text = text[:-1]
        out.append(text[len(sent):])
        sent = max(text, sent, key=len)
    return out


@pytest.mark.parametrize("seed", range(10))
def test_a_text_stream_decoding_its_last_tokens_gives_the_whole_texts_deltas(tokenizer, seed):
    """Real text and random ids (multi-byte characters cut across tokens, special tokens), committed 1-9
    tokens a step, with and without stop strings: the same deltas as decoding the whole text each step."""
    from blockdraft.tokenizer import TextStream
    rng = random.Random(seed)
    if seed % 2:
        pool = list(range(tokenizer.vocab_size)) + list(range(17)) * 800
        tokens = [rng.choice(pool) for _ in range(rng.randint(20, 200))]
    else:
        text = "Café naïve — 東京 🙂 façade " * 3 + open(__file__).read()[:2000]
        tokens = tokenizer.encode(text[rng.randint(0, 200):], add_special_tokens=False)[:300]
    steps, n = [], 0
    while n < len(tokens):
        n = min(len(tokens), n + rng.randint(1, 9))
        steps.append(tokens[:n])
    full = tokenizer.decode(tokens)
    for stops in ((), (full[len(full) // 2:len(full) // 2 + rng.randint(1, 6)] or "x",)):
        stream = TextStream(tokenizer.decode, stops)
        assert [stream.delta(ids, i == len(steps) - 1) for i, ids in enumerate(steps)] == \
            whole_text_deltas(tokenizer.decode, stops, steps)


def test_a_long_text_stream_decodes_only_its_last_tokens():
    from blockdraft.tokenizer import TextStream
    calls = []

    def decode(ids):
        calls.append(len(ids))
        return "".join(chr(97 + i % 26) for i in ids)

    stream = TextStream(decode, ())
    ids = list(range(3000))
    text = "".join(stream.delta(ids[:n], n == 3000) for n in range(1, 3001))
    assert max(calls) < 64 and text == decode(ids)
