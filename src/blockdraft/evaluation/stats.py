"""The statistics `blockdraft eval` reports: the exact McNemar test on paired pass/fail outcomes
and a 95% confidence interval for the mean acceptance length.

Acceptance lengths are not independent draws (steps of one answer share its text), so the
interval treats prompts as clusters: mean AL = Σ committed / Σ steps over prompts, with the
ratio estimator's linearised (cluster-robust) standard error and a normal quantile.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054          # the standard normal's 97.5% quantile


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for the discordant pairs: `b` = prompts only the first arm
    got right, `c` = only the second. Under H0 each discordant pair goes either way with
    probability 1/2: p = min(1, 2 · P[Binomial(b + c, 1/2) ≤ min(b, c)])."""
    for name, v in (("b", b), ("c", c)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"mcnemar_exact: {name} must be a count >= 0, got {v!r}")
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n        # exact integers until the division
    return min(1.0, 2 * tail)


def paired_counts(first: list[bool], second: list[bool]) -> dict:
    """The 2×2 table of paired outcomes: both right, only first, only second, both wrong."""
    if len(first) != len(second):
        raise ValueError(f"paired outcomes need equal lengths, got {len(first)} and {len(second)}")
    pairs = list(zip(first, second))
    return {"both": sum(a and b for a, b in pairs), "only_first": sum(a and not b for a, b in pairs),
            "only_second": sum(b and not a for a, b in pairs), "neither": sum(not a and not b for a, b in pairs)}


def mean_al_ci(per_prompt: list[list[int]]) -> dict:
    """Mean AL over all verify steps with a 95% interval, prompts as clusters.
    `per_prompt[i]` = the acceptance lengths of prompt i's verify steps."""
    clusters = [(sum(a), len(a)) for a in per_prompt if a]
    steps = sum(s for _, s in clusters)
    if not steps:
        return {"mean_al": None, "ci95": None, "steps": 0, "prompts": 0}
    mean = sum(c for c, _ in clusters) / steps
    n = len(clusters)
    if n < 2:
        return {"mean_al": mean, "ci95": None, "steps": steps, "prompts": n}
    # residuals of the ratio estimator: e_i = committed_i - mean * steps_i
    var = n / (n - 1) * sum((c - mean * s) ** 2 for c, s in clusters) / steps ** 2
    half = Z95 * math.sqrt(var)
    return {"mean_al": mean, "ci95": [mean - half, mean + half], "steps": steps, "prompts": n}
