"""Scoring: HumanEval's own canonical solutions pass (as a body and as a whole function in a code
block) and wrong code fails; math answers by their last number."""

import gzip
import json

import pytest

from blockdraft.bench.prompt_sets import humaneval_path
from blockdraft.evaluation.sets import load_items, math_correct, score


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail():
    with gzip.open(humaneval_path(), "rt") as f:
        rows = [json.loads(line) for line, _ in zip(f, range(2))]
    for item, row in zip(load_items("humaneval", 2), rows):
        assert score("humaneval", item, row["canonical_solution"], 5.0) == (True, "passed")
        whole = f"Here it is:\n```python\n{row['prompt']}{row['canonical_solution']}```\nDone."
        assert score("humaneval", item, whole, 5.0)[0] is True
        ok, why = score("humaneval", item, "```python\ndef " + row["entry_point"] + "(*a):\n    return None\n```", 5.0)
        assert ok is False and "AssertionError" in why


@pytest.mark.parametrize("answer,reference,ok", [
    ("4 notebooks cost 12 dollars, plus 2: she spends 14 dollars.", "14", True),
    ("She spends 12 dollars.", "14", False),
    ("42/56 simplifies to 3/4.", "3/4", True),
    ("It takes 1,200 / 40 = 30 minutes", "30", True),
    ("24.5 liters", "24.5", True),
    ("No. 91 = 7 x 13.", "no", True),
    ("Yes, 91 is prime.", "no", False),
    ("no numbers here", "14", False),
])
def test_math_scoring(answer, reference, ok):
    assert math_correct(answer, reference) is ok


def test_math_set_has_a_reference_for_every_item_and_chat_has_none():
    math_items, chat_items = load_items("math"), load_items("chat")
    assert len(math_items) >= 20 and all(it.reference for it in math_items)
    assert all(it.reference is None for it in chat_items)
    assert score("chat", chat_items[0], "anything", 1.0) == (None, "not scored")
