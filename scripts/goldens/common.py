"""Shared by the golden generators. They run in each reference's own venv, where blockdraft is not
installed: the weight digests come from the stdlib-only `blockdraft.checkpoints.digest`, read from src/."""

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
from blockdraft.checkpoints.digest import dir_digest, fixture_digest  # noqa: E402  (the tests' digests)

__all__ = ["FIXTURES", "GOLDENS", "INTEROP_DFLASH", "SHIPPED", "dir_digest", "fixture_digest", "prompts", "write"]
FIXTURES = ROOT / "src" / "blockdraft" / "assets" / "tiny"
SHIPPED = ROOT / "src" / "blockdraft" / "assets" / "smollm2"
GOLDENS = ROOT / "tests" / "goldens"
# the shipped SmolLM2 DFlash drafter (z-lab layout, the target's full vocabulary and LM head), which the
# reference `dflash` package reads as it is
INTEROP_DFLASH = SHIPPED / "dflash"


def prompts(n: int = 4, seed: int = 5, vocab: int = 126) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(4, 24))] for _ in range(n)]


def write(name: str, payload: dict) -> None:
    GOLDENS.mkdir(parents=True, exist_ok=True)
    (GOLDENS / name).write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {GOLDENS / name}")
