"""Stop conditions: EOS ids and stop strings, checked on newly committed tokens.

A stop inside an accepted run truncates there: tokens after the one that
completed the stop are dropped; that token is kept in token_ids (as vLLM does);
the text layer cuts a stop string out of the returned text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class StopCriteria:
    eos_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None

    def first_stop(self, tokens: list[int], new_from: int) -> tuple[int, str] | None:
        """If a stop occurs among tokens[new_from:], return (tokens to keep, reason)."""
        for i in range(new_from, len(tokens)):
            if tokens[i] in self.eos_ids:
                return i + 1, "stop"
        if self.stop_strings and self.decode is not None:
            for i in range(new_from, len(tokens)):
                text = self.decode(tokens[: i + 1])
                if any(s in text for s in self.stop_strings):
                    return i + 1, "stop"
        return None
