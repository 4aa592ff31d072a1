"""`generate --tp N` and `serve --tp N` on each tensor-parallel rank: the sharded models under the
ordinary batch engine, started by `parallel/launch.run_tp`.

Rank 0 schedules and every rank runs the same step (`parallel/mirror.py`): full logits are gathered
for verification, the DSpark chain's argmax is global, seeded sampling uses identical
generators, so every rank makes the same decisions; rank 0's result is returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..llm import LLM
from ..parallel.layers import TPGroup
from ..parallel.mirror import follow
from ..sampling.params import SamplingParams


@dataclass(frozen=True)
class GenerateJob:
    llm_kwargs: dict                      # LLM(...) arguments (target, drafter, dtype, ...)
    prompts: tuple[tuple[int, ...], ...]
    params: SamplingParams
    return_logits: bool = False           # also return the target's prompt logits (tests compare them)


def generate_task(tp: TPGroup, job: GenerateJob) -> dict | None:
    llm = LLM(**job.llm_kwargs, tp=tp)
    out: dict = {}
    if job.return_logits:                 # every rank joins the forward's collectives
        with torch.inference_mode():
            out["logits"] = [llm.target(torch.tensor([list(p)])).logits[0].float() for p in job.prompts]
    if tp.rank != 0:
        follow(llm.engine)
        return None
    try:
        out["generations"] = llm.generate(prompt_token_ids=[list(p) for p in job.prompts], sampling_params=job.params)
    finally:
        llm.engine.shutdown()
    return out


@dataclass(frozen=True)
class ServeJob:
    llm_kwargs: dict
    model_name: str
    api_key: str | None
    host: str
    port: int


def serve_task(tp: TPGroup, job: ServeJob) -> None:
    """Rank 0 serves HTTP and schedules; the other ranks follow its steps."""
    import signal
    import sys

    llm = LLM(**job.llm_kwargs, tp=tp)
    if tp.rank != 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)      # rank 0 decides when to stop
        follow(llm.engine)
        return
    import uvicorn

    from ..server.app import build_app, startup_line

    print(f"{startup_line(llm, job.host, job.port)} | tp {tp.world}", file=sys.stderr, flush=True)
    try:
        uvicorn.run(build_app(llm, model_name=job.model_name, api_key=job.api_key), host=job.host, port=job.port,
                    log_level="info")
    finally:
        llm.engine.shutdown()
