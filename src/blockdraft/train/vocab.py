"""The draft vocabulary: the target ids a pruned drafter can propose, chosen by teacher-data frequency.

A drafter's LM head over the whole vocabulary is most of its cost on a small target
(SmolLM2: 49,152 × 576 per draft slot). The target's own responses use far fewer ids;
keeping the most frequent ones (plus the stop tokens) covers nearly every position, and
a position whose token is outside the draft vocabulary is only a rejected draft, never a
wrong output (verification is unchanged).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from ..errors import RequestError


@dataclass(frozen=True)
class DraftVocab:
    ids: torch.Tensor       # [draft_vocab_size] sorted target ids
    coverage: float         # share of counted response tokens whose id is kept
    counted_tokens: int

    def summary(self) -> dict:
        return {"draft_vocab_size": len(self.ids), "coverage": self.coverage, "counted_tokens": self.counted_tokens}


def token_counts(sequences: Iterable[Sequence[int]], vocab_size: int) -> torch.Tensor:
    """[vocab_size] how often each id occurs in `sequences`."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        ids = torch.as_tensor(list(seq), dtype=torch.long)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise RequestError(f"token id outside [0, {vocab_size}) in the teacher data "
                               f"(min {int(ids.min())}, max {int(ids.max())})")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def choose_draft_vocab(counts: torch.Tensor, size: int, always: Iterable[int] = ()) -> DraftVocab:
    """The `size` most frequent ids (ties: lower id first), always including `always` (e.g. EOS)."""
    vocab = counts.shape[0]
    always = sorted(set(int(i) for i in always))
    if not 0 < size <= vocab:
        raise RequestError(f"draft vocabulary size {size} must be in [1, {vocab}]")
    if len(always) > size:
        raise RequestError(f"draft vocabulary size {size} is smaller than the {len(always)} ids it must keep")
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))
    keep = set(always)
    for i in order:
        if len(keep) == size:
            break
        keep.add(i)
    ids = torch.tensor(sorted(keep), dtype=torch.long)
    total = int(counts.sum())
    return DraftVocab(ids, float(counts[ids].sum()) / total if total else 1.0, total)
