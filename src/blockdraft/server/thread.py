"""`ServerThread`: the OpenAI-compatible app (`app.build_app`) under a real uvicorn server on a free
127.0.0.1 port, in a background thread, for the length of a `with` block (tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from ..llm import LLM
from .app import build_app


class ServerThread:
    """`llm` served as `model_name` (behind `api_key` unless None) on 127.0.0.1:`port`; entering starts
    the server and returns once it accepts connections, leaving stops it."""

    def __init__(self, llm: LLM, model_name: str = "blockdraft", api_key: str | None = None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        self.llm = llm
        config = uvicorn.Config(build_app(llm, model_name, api_key), host="127.0.0.1", port=self.port,
                                log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
