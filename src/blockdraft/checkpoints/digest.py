"""Short sha256 digests of checkpoint directories: what a golden file records of the weights it was made
from, so a test can tell its goldens from stale weights.

Standard library only: the golden generators (`scripts/goldens/`) read this file from src/ inside the
reference implementations' own venvs, where blockdraft and torch are not installed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

TINY_FIXTURES = Path(__file__).resolve().parents[1] / "assets" / "tiny"


def dir_digest(path: Path, names: tuple[str, ...] | None = ("config.json", "model.safetensors")) -> str:
    """sha256 of a checkpoint's files (those of `path` named in `names`; None: all of them), 16 hex digits."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).iterdir() if names is None or p.name in names):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def fixture_digest(name: str) -> str:
    """sha256 of every file of the tiny shipped checkpoint `name` (assets/tiny/NAME), 16 hex digits."""
    return dir_digest(TINY_FIXTURES / name, names=None)
