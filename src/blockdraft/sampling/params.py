"""`SamplingParams` in vLLM's spelling, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import RequestError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif self.stop is not None:
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens <= 0:
            raise RequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not self.temperature >= 0:
            raise RequestError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise RequestError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if any(not s for s in self.stop or ()):
            raise RequestError(f"stop strings must be non-empty, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """A per-request generator: seeded runs reproduce whatever else is running."""
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)
