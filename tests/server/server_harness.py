"""A real uvicorn server on 127.0.0.1 (random port) in a background thread, per test module.

Not a conftest.py: tests/conftest.py is imported by name, and a second conftest would shadow it.
"""

import socket
import threading
import time

import pytest
import uvicorn

from blockdraft.llm import LLM, TINY_ASSETS
from blockdraft.server.app import build_app

API_KEY = "sk-test"


class ServerThread:
    def __init__(self, llm: LLM, api_key: str | None = API_KEY):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.llm = llm
        config = uvicorn.Config(build_app(llm, "tiny", api_key), host="127.0.0.1", port=self.port,
                                log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def server():
    llm = LLM(target=TINY_ASSETS / "target-qwen3", drafter=TINY_ASSETS / "dspark", max_batch=8,
              adaptive_speculation=False)
    with ServerThread(llm) as srv:
        yield srv
