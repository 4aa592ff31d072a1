"""Start a tensor-parallel group: N local worker processes (torch.multiprocessing), or the
processes `torchrun` started (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the env).

Every rank runs the same task on the same inputs; rank 0 returns its result (and owns I/O).
Collectives carry a timeout, and a worker that dies makes `run_tp` raise an error naming the
rank instead of leaving the others waiting.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import BlockdraftError
from .layers import TPGroup

DEFAULT_TIMEOUT_S = 120


class WorkerError(BlockdraftError):
    """A tensor-parallel worker failed or died."""


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def init_group(rank: int, world: int, init_method: str, timeout_s: float = DEFAULT_TIMEOUT_S,
               device: str = "cpu") -> TPGroup:
    """gloo for CPU tensors, NCCL only when the ranks' tensors are on CUDA (not merely when CUDA is visible)."""
    backend = "nccl" if str(device).startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    return TPGroup(rank, world)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, timeout_s: float, task: Callable, payload: Any, results) -> None:
    tp = init_group(rank, world, f"tcp://127.0.0.1:{port}", timeout_s)
    try:
        out = task(tp, payload)
        if rank == 0:   # plain pickle copies tensors (torch's shared-memory handles die with this process)
            results.put(pickle.dumps(out))
        dist.barrier()  # no rank tears gloo down while a peer still has traffic in flight
    finally:
        dist.destroy_process_group()
    # done and reported: leave without running C++ static destructors, where gloo's threads have been
    # seen to abort the process ("terminate called without an active exception", exit -6) at random
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_tp(world: int, task: Callable[[TPGroup, Any], Any], payload: Any, timeout_s: float = DEFAULT_TIMEOUT_S):
    """Run `task(tp, payload)` on `world` ranks; return rank 0's result (None on other torchrun ranks)."""
    if launched_by_torchrun():              # this process is one rank of a torchrun group
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if size != world:
            raise WorkerError(f"--tp {world} but torchrun started WORLD_SIZE={size} processes")
        tp = init_group(rank, size, "env://", timeout_s)
        try:
            out = task(tp, payload)
            dist.barrier()
            return out if rank == 0 else None
        finally:
            dist.destroy_process_group()
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    try:
        mp.start_processes(_worker, args=(world, _free_port(), timeout_s, task, payload, results), nprocs=world,
                           join=True, start_method="spawn")
    except mp.ProcessExitedException as e:
        raise WorkerError(f"tensor-parallel worker rank {e.error_index} died (exit code {e.exit_code}); "
                          f"the other ranks were stopped") from None
    except mp.ProcessRaisedException as e:
        last = str(e).strip().splitlines()[-1]
        raise WorkerError(f"tensor-parallel worker failed: {last}") from None
    if results.empty():
        raise WorkerError("tensor-parallel rank 0 returned no result")
    return pickle.loads(results.get())
