"""Drives an `LLMEngine` from asyncio: one worker thread owns the engine, requests get queues.

Every engine call (add, abort, step) runs on the same single worker thread, so the
engine never sees concurrency; a background task steps it while work is pending
and hands each request's newly committed tokens to that request's queue.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..engine.engine import LLMEngine, RequestOutput
from ..sampling.params import SamplingParams


@dataclass
class Stream:
    request_id: str
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blockdraft-engine")
        self.streams: dict[str, Stream] = {}
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.worker, fn, *args)

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Abort everything still running and stop stepping (shutdown)."""
        for rid in list(self.streams):
            await self.abort(rid)
        if self.task is not None:
            self.task.cancel()
        self.worker.shutdown(wait=True)

    async def add(self, prompt_ids: list[int], params: SamplingParams) -> Stream:
        rid = await self._call(self.engine.add_request, prompt_ids, params)
        stream = self.streams[rid] = Stream(rid)
        self.wakeup.set()
        return stream

    async def abort(self, request_id: str) -> None:
        if self.streams.pop(request_id, None) is not None:
            await self._call(self.engine.abort, request_id)

    async def _loop(self) -> None:
        while True:
            if not self.engine.has_unfinished():
                self.wakeup.clear()
                await self.wakeup.wait()
            try:
                outputs = await self._call(self.engine.step)
            except Exception as e:  # a failed step: end the requests it held with an error, keep serving
                await self._call(self.engine.abort_all, "error")
                for stream in list(self.streams.values()):
                    stream.queue.put_nowait(e)
                self.streams.clear()
                continue
            for out in outputs:
                self._dispatch(out)

    def _dispatch(self, out: RequestOutput) -> None:
        stream = self.streams.get(out.request_id)
        if stream is None:
            return
        stream.queue.put_nowait(out)
        if out.finished:
            self.streams.pop(out.request_id, None)
