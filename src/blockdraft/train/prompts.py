"""Training prompt sources that are available offline, each with a named license.

- `self_instruct`: user turns the target writes itself (Magpie-style: the chat template up
  to "user\\n" is fed to the target and sampled at T=1 until end of turn). The text is the
  target's own output (SmolLM2: Apache-2.0).
- `stdlib_code`: "write a function" requests built from the first docstring sentence of
  public functions in Python's standard library (PSF License 2.0).
- `templated_math`: arithmetic word problems from templates in this file (this project's
  license), numbers drawn from a seeded generator.
- `self_instruct(..., openers=OPENERS)`: the same, steered by an opening phrase written here
  ("Explain", "List", "Rewrite", ...) so the requests cover factual questions, lists,
  rewriting, how-tos and code (the continuation is the target's; Apache-2.0).
- `stdlib_rewrite`: rewrite / summarise / explain requests over standard-library docstring
  paragraphs (PSF License 2.0).
- `follow_ups`: a second user turn (templates here) after a first turn and the target's own
  answer, for multi-turn data.

None of them overlaps the evaluation sets (`bench/prompt_sets.py`: HumanEval and the chat
and math files in assets/eval, written for this project); `tests/train/test_prompts.py`
checks that.
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
from pathlib import Path

from ..errors import CheckpointError, RequestError

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
    "A baker makes {a} muffins and packs them in bags of {b}. How many full bags are there, and how many "
    "muffins are left over?",
    "Lisa saves {d} dollars a week. How many weeks does she need to save {c} dollars?",
    "A garden has {b} rows with {a} plants in each row. {d} plants die. How many plants are left?",
    "A car uses {b} litres of fuel per 100 km. How much fuel does it need for {c} km?",
    "Ben is {b} years old. His mother is {a} years older than him. How old will she be in {d} years?",
    "A class of {c} pupils goes on a trip. Each bus seats {a}. How many buses are needed?",
    "What is {d} percent of {c}?",
    "A recipe needs {b} eggs for {d} cookies. How many eggs are needed for {c} cookies?",
    "Convert {c} minutes into hours and minutes.",
    "The sum of two numbers is {c} and their difference is {b}. What are the numbers?",
    "A square has a perimeter of {c} cm. What is its area?",
    "Is {c} a prime number? Explain how you checked.",
)

OPENERS = ("Explain", "What is", "Why do", "How do I", "List", "Give me", "Rewrite", "Summarize", "Write a",
           "Can you", "Compare", "Describe", "What are the", "Suggest", "Translate", "Write a Python function",
           "How can I", "What happens when", "Tell me about", "Create a", "Who was", "When did", "Help me")

REWRITE_FORMS = ("Rewrite this in simpler words:\n\n{doc}", "Summarize the following in one sentence:\n\n{doc}",
                 "Explain what this documentation means, with an example:\n\n{doc}",
                 "Turn this into a short bulleted list:\n\n{doc}", "Make this text more formal:\n\n{doc}")

FOLLOW_UPS = ("Can you explain that more simply?", "Give me a concrete example.", "Can you make it shorter?",
              "What are the main points, as a list?", "Why is that?", "Can you go into more detail?",
              "What would be a common mistake here?", "Thanks! Can you summarize your answer in one sentence?")


def _stdlib_docs(min_len: int = 20, max_len: int = 300, paragraph: bool = False):
    """(name, signature, first docstring paragraph) of public stdlib functions, sorted."""
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
            if not min_len <= len(doc) <= max_len:
                continue
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                sig = "(...)"
            entries.append((name, sig, doc))
    return entries


def stdlib_code(n: int, seed: int = 0) -> list[str]:
    """Up to `n` function-writing requests from standard-library docstrings (PSF-2.0)."""
    entries = _stdlib_docs()
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


def stdlib_rewrite(n: int, seed: int = 0) -> list[str]:
    """Up to `n` rewrite/summarise/explain requests over stdlib docstring paragraphs (PSF-2.0)."""
    entries = _stdlib_docs(min_len=80, max_len=600)
    rng = random.Random(seed + 1)
    rng.shuffle(entries)
    return [rng.choice(REWRITE_FORMS).format(doc=doc) for _, _, doc in entries[:n]]


def follow_ups(first_turns: list[tuple[str, str]], seed: int = 0) -> list[list[dict]]:
    """Chat messages [user, assistant, user]: each first turn and its answer, then a follow-up."""
    rng = random.Random(seed)
    return [[{"role": "user", "content": q}, {"role": "assistant", "content": a},
             {"role": "user", "content": rng.choice(FOLLOW_UPS)}] for q, a in first_turns]


def self_instruct(llm, n: int, seed: int = 0, max_tokens: int = 48, openers: tuple[str, ...] = ()) -> list[str]:
    """`n` user requests sampled from the target itself (T=1), deduplicated, non-trivial ones kept.
    With `openers`, request i starts with `openers[i % len(openers)]` and the target continues it."""
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
        starts = [openers[i % len(openers)] if openers else "" for i in range(len(params))]
        queries = [pre_query + (tok.encode(s, add_special_tokens=False) if s else []) for s in starts]
        results = llm.engine.generate(queries, params)
        for start, r in zip(starts, results):
            text = (start + tok.decode(r.token_ids)).strip()
            if r.finish_reason == "stop" and len(text) >= 15 and text.lower() not in seen:
                seen.add(text.lower())
                out.append(text)
        attempt += 1
    return out[:n]


def read_prompts(path: str) -> list[str]:
    """Prompts from a file: one per non-empty line, or a JSONL file's `prompt` fields (named errors)."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"missing file: {p}")
    lines = [(i, line) for i, line in enumerate(p.read_text().splitlines(), 1) if line.strip()]
    if p.suffix != ".jsonl":
        return [line for _, line in lines]
    out = []
    for i, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise RequestError(f"{p}:{i}: not a JSON object ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise RequestError(f"{p}:{i}: needs a string field 'prompt', got {line[:80]!r}")
        out.append(row["prompt"])
    return out


def builtin_prompts(llm, spec: str) -> list[str]:
    """`builtin[:N]`: N prompts (default 240) from this module's offline sources, 3:2.5:1.5 self-instruct,
    stdlib code and templated arithmetic."""
    _, _, n = spec.partition(":")
    try:
        total = int(n) if n else 240
    except ValueError:
        raise RequestError(f"--prompts builtin:N needs an integer N, got {spec!r}") from None
    if total < 6:
        raise RequestError(f"--prompts builtin:N needs N >= 6, got {total}")
    return (self_instruct(llm, total * 3 // 7) + stdlib_code(total * 5 // 14)
            + templated_math(total - total * 3 // 7 - total * 5 // 14))


def split_held_out(prompts: list, held_out: list | None = None) -> tuple[list, list]:
    """(training prompts, held-out prompts): `held_out` if given, else the last 10% (at least one)."""
    if held_out is not None:
        return prompts, held_out
    cut = max(1, len(prompts) // 10)
    return prompts[:-cut], prompts[-cut:]
