"""Stop conditions: EOS ids and stop strings, checked on newly committed tokens.

A stop inside an accepted run truncates there: tokens after the one that
completed the stop are dropped; that token is kept in token_ids (as vLLM does);
the text layer cuts a stop string out of the returned text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


EDGE = 8    # characters at the start of a window's text that may differ from the whole text's there (a
            # multi-byte character cut by the window, a leading space the tokenizer drops)


@dataclass
class StopCriteria:
    eos_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None

    def first_stop(self, tokens: list[int], new_from: int) -> tuple[int, str] | None:
        """If a stop occurs among tokens[new_from:], return (tokens to keep, reason). A stop string is looked
        for in the text of tokens[:i + 1] for each new token i; checked step by step, one that was not in the
        text before token i ends in what token i changed, so only the last characters need decoding (`tail`):
        the cost of a step does not grow with the length of the generation."""
        for i in range(new_from, len(tokens)):
            if tokens[i] in self.eos_ids:
                return i + 1, "stop"
        if self.stop_strings and self.decode is not None:
            longest = max(len(s) for s in self.stop_strings)
            for i in range(new_from, len(tokens)):
                text = self.tail(tokens, i + 1, longest + len(self.decode(tokens[i:i + 1])) + EDGE)
                if any(s in text for s in self.stop_strings):
                    return i + 1, "stop"
        return None

    def tail(self, tokens: list[int], end: int, chars: int) -> str:
        """At least the last `chars` characters of the text of tokens[:end] (all of it where shorter), decoded
        from as few tokens before `end` as give them beyond the window's uncertain first `EDGE`."""
        width = chars
        while True:
            start = max(0, end - width)
            text = self.decode(tokens[start:end])
            if start == 0:
                return text
            if len(text) >= chars + EDGE:
                return text[EDGE:]
            width *= 2
