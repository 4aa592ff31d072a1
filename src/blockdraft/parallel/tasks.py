"""What each tensor-parallel rank runs: load, shard, then the ordinary single-stream loop.

Every rank makes the same decisions (full logits are gathered for verification, the DSpark
chain's argmax is global, seeded sampling uses identical generators), so no step needs a
broadcast; rank 0's result is returned to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..decode import Generation, generate_one
from ..loading import load_drafter, load_target
from ..sampling.params import SamplingParams
from ..sampling.stops import StopCriteria
from .layers import TPGroup
from .shard import shard_models


@dataclass(frozen=True)
class ModelSpec:
    target_dir: Path
    drafter_dir: Path | None = None
    dtype: str = "float32"
    mode: str | None = None
    block_size: int | None = None


@dataclass(frozen=True)
class GenerateJob:
    models: ModelSpec
    prompts: tuple[tuple[int, ...], ...]
    params: SamplingParams
    eos_ids: frozenset[int] = frozenset()
    confidence_threshold: float = 0.0
    stop_strings: tuple[str, ...] = ()
    return_logits: bool = False           # also return the target's prompt logits (tests compare them)


def load_sharded(spec: ModelSpec, tp: TPGroup):
    target = load_target(spec.target_dir, spec.dtype)
    drafter = None
    if spec.drafter_dir is not None:
        drafter = load_drafter(spec.drafter_dir, target, mode=spec.mode, block_size=spec.block_size)
    shard_models(target, [drafter] if drafter is not None else [], tp)
    return target, drafter


def generate_task(tp: TPGroup, job: GenerateJob) -> dict:
    target, drafter = load_sharded(job.models, tp)
    decode = None
    if job.stop_strings:
        from ..tokenizer import Tokenizer

        decode = Tokenizer(job.models.target_dir).decode
    stop = StopCriteria(eos_ids=job.eos_ids, stop_strings=job.stop_strings, decode=decode)
    gens: list[Generation] = [generate_one(target, list(p), job.params, drafter, stop, job.confidence_threshold)
                              for p in job.prompts]
    out: dict = {"generations": gens}
    if job.return_logits:
        with torch.inference_mode():
            out["logits"] = [target(torch.tensor([list(p)])).logits[0].float() for p in job.prompts]
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

    from ..llm import LLM
    from .mirror import follow

    llm = LLM(**job.llm_kwargs, tp=tp)
    if tp.rank != 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)      # rank 0 decides when to stop
        follow(llm.engine)
        return
    import uvicorn

    from ..server.app import build_app

    try:
        uvicorn.run(build_app(llm, model_name=job.model_name, api_key=job.api_key), host=job.host, port=job.port,
                    log_level="info")
    finally:
        llm.engine.shutdown()
