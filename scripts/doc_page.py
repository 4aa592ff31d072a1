"""What the doc generators share: write a generated page, or (`--check`) say whether it is current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]


def generate(description: str, path: Path, render: Callable[[], str], script: str) -> int:
    """`script [--check]`: write `render()` to `path`, or exit 1 where `path` differs from it."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help=f"compare with {path.relative_to(ROOT)} instead of writing it")
    args = ap.parse_args()
    text = render()
    if args.check:
        if not path.is_file() or path.read_text() != text:
            print(f"{path.relative_to(ROOT)} is out of date: run python scripts/{script}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path.relative_to(ROOT)}")
    return 0
