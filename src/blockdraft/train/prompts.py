"""Training prompt sources that are available offline, each with a named license.

- `self_instruct`: user turns the target writes itself (Magpie-style: the chat template up
  to "user\\n" is fed to the target and sampled at T=1 until end of turn). The text is the
  target's own output (SmolLM2: Apache-2.0).
- `stdlib_code`: "write a function" requests built from the first docstring sentence of
  public functions in Python's standard library (PSF License 2.0).
- `templated_math`: arithmetic word problems from templates in this file (this project's
  license), numbers drawn from a seeded generator.

None of them overlaps the evaluation sets (`bench/prompt_sets.py`: HumanEval and the chat
and math files in assets/eval, written for this project); `tests/train/test_prompts.py`
checks that.
"""

from __future__ import annotations

import importlib
import inspect
import random

STDLIB_MODULES = ("string", "textwrap", "statistics", "heapq", "bisect", "itertools", "functools", "os.path",
                  "shutil", "json", "base64", "binascii", "html", "urllib.parse", "fnmatch", "glob", "difflib",
                  "colorsys", "calendar", "datetime", "math", "random", "re", "operator", "copy", "pprint",
                  "ipaddress", "uuid", "zlib", "gzip", "csv", "configparser", "shlex", "secrets", "fractions",
                  "decimal", "collections", "contextlib", "inspect", "keyword", "tokenize", "zipfile")

CODE_FORMS = ("Write a Python function `{name}{sig}` that does the following: {doc}",
              "Implement `{name}{sig}` in Python. {doc}",
              "How would I write `{name}` myself in Python? It should do this: {doc}")

MATH_TEMPLATES = (
    "A shop sells {a} apples on Monday and {b} apples on Tuesday. How many apples did it sell in total?",
    "Tom has {a} marbles. He gives {b} to his friend. How many marbles does Tom have left?",
    "A box holds {a} pencils. How many pencils are in {b} boxes?",
    "There are {c} students split equally into {b} groups. How many students are in each group?",
    "A train travels {a} km every hour. How far does it travel in {b} hours?",
    "What is {a} plus {b}, multiplied by {d}?",
    "Compute {a} * {b} - {d}.",
    "A rectangle is {a} cm long and {b} cm wide. What is its area?",
    "Sara reads {a} pages a day. How many days does she need for a book of {c} pages?",
    "If a shirt costs {a} dollars and is discounted by {d} percent, what is the new price?",
    "Solve for x: {a}x + {b} = {c}.",
    "What is the average of {a}, {b} and {d}?",
)


def stdlib_code(n: int, seed: int = 0) -> list[str]:
    """Up to `n` function-writing requests from standard-library docstrings (PSF-2.0)."""
    entries = []
    for mod_name in STDLIB_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for name, fn in sorted(vars(mod).items()):
            if name.startswith("_") or not (inspect.isfunction(fn) or inspect.isbuiltin(fn)):
                continue
            doc = (inspect.getdoc(fn) or "").strip().split("\n\n")[0].replace("\n", " ")
            if not 20 <= len(doc) <= 300:
                continue
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                sig = "(...)"
            entries.append((name, sig, doc))
    rng = random.Random(seed)
    rng.shuffle(entries)
    return [rng.choice(CODE_FORMS).format(name=name, sig=sig, doc=doc) for name, sig, doc in entries[:n]]


def templated_math(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        b = rng.randint(2, 12)
        out.append(rng.choice(MATH_TEMPLATES).format(a=rng.randint(3, 95), b=b, c=b * rng.randint(3, 30),
                                                     d=rng.choice([5, 10, 15, 20, 25, 50])))
    return out


def self_instruct(llm, n: int, seed: int = 0, max_tokens: int = 48) -> list[str]:
    """`n` user requests sampled from the target itself (T=1), deduplicated, non-trivial ones kept."""
    from ..sampling.params import SamplingParams

    tok = llm._need_tokenizer()
    marker = "\u2063"
    rendered = tok.apply_chat_template([{"role": "user", "content": marker}])
    pre_query = tok.encode(rendered[:rendered.index(marker)], add_special_tokens=False)
    out: list[str] = []
    seen: set[str] = set()
    attempt = 0
    while len(out) < n and attempt < 4:
        want = n - len(out)
        params = [SamplingParams(temperature=1.0, top_p=0.95, max_tokens=max_tokens,
                                 seed=seed * 1_000_003 + attempt * 100_003 + i) for i in range(want + want // 4)]
        results = llm.engine.generate([pre_query] * len(params), params)
        for r in results:
            text = tok.decode(r.token_ids).strip()
            if r.finish_reason == "stop" and len(text) >= 15 and text.lower() not in seen:
                seen.add(text.lower())
                out.append(text)
        attempt += 1
    return out[:n]
