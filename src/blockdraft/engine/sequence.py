"""One request's state inside the engine.

Invariant while decoding: `tokens` = prompt + generated; every token but the last
(the anchor) has committed target KV and drafter context (`num_computed`).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from ..sampling.params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    order: int                               # admission priority: lower = older
    generator: torch.Generator | None = None
    tokens: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    registered: tuple[int, int] = (0, 0)     # the table's first blocks in the prefix cache, their chained hash
    num_computed: int = 0                    # tokens with committed target KV
    num_drafter_ctx: int = 0                 # tokens with drafter context written (<= num_computed)
    pending_taps: list = field(default_factory=list)  # taps of committed rows not yet drafter context
    ring_row: int | None = None              # row in the sliding-window drafter ring, while running
    state_slot: int | None = None            # recurrent-state slot of a hybrid target, while running
    status: Status = Status.WAITING
    finish_reason: str | None = None
    acceptance_lengths: list[int] = field(default_factory=list)
    drafted: int = 0                         # draft tokens proposed for this request
    accepted: int = 0                        # of which the target kept
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    unread: int = 0                          # tokens committed in the current step

    def __post_init__(self):
        if not self.tokens:
            self.tokens = list(self.prompt_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.num_prompt:]

    @property
    def max_length(self) -> int:
        return self.num_prompt + self.params.max_tokens

    @property
    def prefill_end(self) -> int:
        """Tokens the prefill must cover: the whole prompt, or (after preemption) all but the anchor."""
        return len(self.tokens) - 1 if self.generated else len(self.tokens)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
