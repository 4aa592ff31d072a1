"""blockdraft: lossless speculative decoding with block drafters (DFlash, DFlash2, DSpark).

Public API (imported lazily so `import blockdraft` stays light):
`load_target`, `load_drafter`, `LLM`, `RequestOutput`, `SamplingParams`, `Tokenizer`, `BlockdraftError`.
"""

from __future__ import annotations

__version__ = "0.1.0"

_EXPORTS = {
    "load_target": "blockdraft.loading",
    "load_drafter": "blockdraft.loading",
    "LLM": "blockdraft.llm",
    "RequestOutput": "blockdraft.engine.engine",
    "SamplingParams": "blockdraft.sampling.params",
    "Tokenizer": "blockdraft.tokenizer",
    "BlockdraftError": "blockdraft.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'blockdraft' has no attribute {name!r}")
