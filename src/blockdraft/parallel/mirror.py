"""The batch engine under tensor parallelism: rank 0 schedules, every rank runs the same step.

`MirroredEngine` wraps rank 0's engine. `add_request` / `abort` run there at once (so
validation errors reach the caller) and are queued; each `step` first broadcasts the
queued commands, then steps. The other ranks (`follow`) apply the same commands in the
same order before the same step, so their schedulers — and so their collectives — stay
in lockstep. Adaptive speculation is off under TP: it decides from wall-clock timings,
which differ between ranks. A rank that disappears turns the next broadcast into a
`WorkerError`.
"""

from __future__ import annotations

import torch.distributed as dist

from ..engine.engine import LLMEngine
from .launch import WorkerError
from .layers import TPGroup


def _broadcast(commands):
    box = [commands]
    try:
        dist.broadcast_object_list(box, src=0)
    except (RuntimeError, ConnectionError) as e:
        raise WorkerError(f"tensor-parallel group lost a rank: {str(e).splitlines()[0]}") from None
    return box[0]


class MirroredEngine:
    def __init__(self, engine: LLMEngine, tp: TPGroup):
        self._engine, self._tp, self._pending = engine, tp, []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def add_request(self, prompt_ids, params=None, request_id=None) -> str:
        rid = self._engine.add_request(prompt_ids, params, request_id)
        self._pending.append(("add", list(prompt_ids), params, rid))
        return rid

    def abort(self, request_id: str) -> None:
        self._engine.abort(request_id)
        self._pending.append(("abort", request_id))

    def step(self):
        commands, self._pending = self._pending, []
        _broadcast(commands)
        return self._engine.step()

    def generate(self, prompts, params):
        """LLMEngine.generate, with adds and steps going through the mirror."""
        return LLMEngine.generate(self, prompts, params)

    def shutdown(self) -> None:
        """Tell the other ranks to leave `follow`."""
        _broadcast(None)


def follow(engine: LLMEngine) -> None:
    """Ranks > 0: apply rank 0's commands and step with it until it shuts down."""
    while True:
        commands = _broadcast([])
        if commands is None:
            return
        for command in commands:
            if command[0] == "add":
                _, prompt, params, rid = command
                engine.add_request(prompt, params, rid)
            else:
                engine.abort(command[1])
        engine.step()
