"""The server tests' constants and a per-module `server` fixture: the tiny fixtures served as "tiny"
behind API_KEY by `blockdraft.server.thread.ServerThread` (a real uvicorn server on a free port).

Not a conftest.py: tests/conftest.py is imported by name, and a second conftest would shadow it.
"""

import pytest

from blockdraft.llm import LLM, TINY_ASSETS
from blockdraft.server.thread import ServerThread

API_KEY = "sk-test"
MODEL = "tiny"


@pytest.fixture(scope="module")
def server():
    llm = LLM(target=TINY_ASSETS / "target-qwen3", drafter=TINY_ASSETS / "dspark", max_batch=8,
              adaptive_speculation=False)
    with ServerThread(llm, MODEL, API_KEY) as srv:
        yield srv
