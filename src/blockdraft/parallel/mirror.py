"""The batch engine under tensor parallelism: rank 0 schedules, every rank runs the same step.

`MirroredEngine` wraps rank 0's engine. `add_request` / `abort` / `abort_all` run there at
once (so validation errors reach the caller) and are queued; each `step` first broadcasts
the queued commands, then steps. Only reads pass through to the engine unmirrored; any
other attribute is an error, so nothing can change rank 0's engine alone. The other ranks
(`follow`) apply the same commands in the same order before the same step, so their
schedulers — and so their collectives — stay in lockstep. Adaptive speculation is off
under TP: it decides from wall-clock timings, which differ between ranks. A rank that
disappears turns the next broadcast into a `WorkerError`.
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


# what passes through to rank 0's engine unmirrored: reads (save_policy only writes its file, and the
# width policy is off under TP)
READS = frozenset({"config", "target", "drafter", "max_model_len", "plan", "blocks", "stats", "seqs", "eos_ids",
                   "has_unfinished", "save_policy"})


class MirroredEngine:
    def __init__(self, engine: LLMEngine, tp: TPGroup):
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_tp", tp)
        object.__setattr__(self, "_pending", [])

    def __getattr__(self, name):
        if name not in READS:
            raise AttributeError(f"LLMEngine.{name} is not mirrored to the other tensor-parallel ranks")
        return getattr(self._engine, name)

    def __setattr__(self, name, value):
        raise AttributeError(f"setting LLMEngine.{name} is not mirrored to the other tensor-parallel ranks")

    def add_request(self, prompt_ids, params=None, request_id=None) -> str:
        rid = self._engine.add_request(prompt_ids, params, request_id)
        self._pending.append(("add", list(prompt_ids), params, rid))
        return rid

    def abort(self, request_id: str) -> None:
        self._engine.abort(request_id)
        self._pending.append(("abort", request_id))

    def abort_all(self, reason: str = "error") -> list[str]:
        victims = self._engine.abort_all(reason)
        self._pending.append(("abort_all", reason))
        return victims

    def step(self):
        commands = list(self._pending)
        self._pending.clear()
        _broadcast(commands)
        return self._engine.step()

    def generate(self, prompts, params):
        """LLMEngine.generate, with adds and steps going through the mirror."""
        return LLMEngine.generate(self, prompts, params)

    def stream(self, request_id: str):
        """LLMEngine.stream, stepping through the mirror."""
        return LLMEngine.stream(self, request_id)

    def shutdown(self) -> None:
        """Tell the other ranks to leave `follow`."""
        _broadcast(None)


def follow(engine: LLMEngine) -> None:
    """Ranks > 0: apply rank 0's commands and step with it until it shuts down."""
    while True:
        commands = _broadcast([])
        if commands is None:
            return
        apply(engine, commands)
        engine.step()


def apply(engine: LLMEngine, commands: list[tuple]) -> None:
    """Replay rank 0's queued commands on this rank's engine, in order."""
    for command in commands:
        if command[0] == "add":
            _, prompt, params, rid = command
            engine.add_request(prompt, params, rid)
        elif command[0] == "abort":
            engine.abort(command[1])
        else:
            engine.abort_all(command[1])
