"""The exact McNemar p-value against scipy's exact binomial test, and the AL interval by hand."""

import math

import pytest
from scipy.stats import binomtest

from blockdraft.evaluation.stats import Z95, mcnemar_exact, mean_al_ci, paired_counts


@pytest.mark.parametrize("b,c", [(0, 0), (0, 1), (1, 0), (3, 7), (7, 3), (10, 10), (12, 31), (0, 25), (40, 55),
                                 (161, 140), (1, 200)])
def test_mcnemar_exact_equals_scipy_binomial(b, c):
    expected = 1.0 if b + c == 0 else binomtest(b, b + c, 0.5, alternative="two-sided").pvalue
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_paired_table_and_bad_counts():
    plain = [True, True, False, False, True, False]
    spec = [True, False, True, False, True, True]
    assert paired_counts(plain, spec) == {"both": 2, "only_first": 1, "only_second": 2, "neither": 1}
    with pytest.raises(ValueError, match="equal lengths"):
        paired_counts([True], [True, False])
    with pytest.raises(ValueError, match="b must be a count"):
        mcnemar_exact(-1, 3)


def test_mean_al_interval_treats_prompts_as_clusters():
    per_prompt = [[1, 3, 2], [4, 4], [1, 1, 1, 2], []]        # the empty prompt contributes nothing
    got = mean_al_ci(per_prompt)
    committed, steps = [6, 8, 5], [3, 2, 4]
    mean = sum(committed) / sum(steps)
    resid = [c - mean * s for c, s in zip(committed, steps)]
    half = Z95 * math.sqrt(3 / 2 * sum(r * r for r in resid)) / sum(steps)
    assert got["mean_al"] == pytest.approx(19 / 9) and got["steps"] == 9 and got["prompts"] == 3
    assert got["ci95"] == pytest.approx([mean - half, mean + half])
    assert mean_al_ci([[2, 2]])["ci95"] is None and mean_al_ci([])["mean_al"] is None
