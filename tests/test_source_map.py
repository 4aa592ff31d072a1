"""The source map in docs/engine.md is generated from the modules' docstrings (scripts/gen_source_map.py):
a module added, moved or re-described without regenerating it fails here."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "gen_source_map.py"


def test_source_map_is_current():
    run = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_source_map_lists_every_module():
    text = (Path(__file__).parents[1] / "docs" / "engine.md").read_text()
    src = Path(__file__).parents[1] / "src" / "blockdraft"
    for path in src.rglob("*.py"):
        rel = path.relative_to(src).as_posix()
        if path.name not in ("__init__.py", "__main__.py"):
            assert f"| `{rel}` |" in text, rel
