"""Shared by the golden generators (runs in each reference's own venv; no blockdraft import)."""

import hashlib
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "src" / "blockdraft" / "assets" / "tiny"
SHIPPED = ROOT / "src" / "blockdraft" / "assets" / "smollm2"
GOLDENS = ROOT / "tests" / "goldens"
# the shipped SmolLM2 DFlash drafter (z-lab layout, the target's full vocabulary and LM head), which the
# reference `dflash` package reads as it is
INTEROP_DFLASH = SHIPPED / "dflash"


def dir_digest(path: Path, names: tuple[str, ...] = ("config.json", "model.safetensors")) -> str:
    """sha256 of a checkpoint's config and weights, so tests can tell goldens from stale weights."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).iterdir() if p.name in names):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def fixture_digest(name: str) -> str:
    h = hashlib.sha256()
    for f in sorted((FIXTURES / name).iterdir()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def prompts(n: int = 4, seed: int = 5, vocab: int = 126) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(4, 24))] for _ in range(n)]


def write(name: str, payload: dict) -> None:
    GOLDENS.mkdir(parents=True, exist_ok=True)
    (GOLDENS / name).write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {GOLDENS / name}")
