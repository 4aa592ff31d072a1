"""`blockdraft train` end to end for a user's target: teacher data, teacher cache, cached steps, output.

The target's greedy responses to the prompts become a teacher shard in `out_dir/teacher`
(made once: a rerun reuses them), one teacher-forced pass per sequence fills the teacher cache
(outside `out_dir`, under `cache_dir`), and `cached.fit_cached` trains the drafter from it,
resumable through `out_dir/state.pt`. At the end `out_dir` holds the drafter in its published
layout, `training.json` (config, loss history, teacher-forced and engine acceptance on the held-out
prompts) and `training.png`. The CLI only parses flags and calls `train_cached`.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

from ..checkpoints.publish import save_drafter
from ..errors import RequestError
from ..models.drafter import BlockDrafter
from ..models.target import TargetModel
from .cached import CachedTrainConfig, fit_cached
from .shards import Conversation, read_manifest, write_shard
from .tap_cache import TapCache, build, spec_for
from .trainer import _plot, mean_acceptance, teacher_responses


def target_identity(target: TargetModel, source: str) -> dict:
    """What the cache manifest records as the target: where it came from, its shape and dtype."""
    cfg = target.config
    shape = f"{cfg.architecture}:{cfg.num_layers}x{cfg.hidden_size}:{cfg.vocab_size}"
    return {"source": source, "shape": shape, "dtype": str(target.dtype).removeprefix("torch.")}


def teacher_shard(target: TargetModel, prompts: list[list[int]], new_tokens: int, teacher_dir: Path,
                  eos_ids: frozenset[int], responses: list[list[int]] | None = None, progress: bool = False) -> None:
    """The target's greedy responses as a teacher shard named by the prompts' digest (kept across reruns)."""
    digest = hashlib.sha256(json.dumps([prompts, new_tokens]).encode()).hexdigest()[:16]
    if any(s["file"] == f"prompts-{digest}.npz" for s in read_manifest(teacher_dir)["shards"]):
        return
    if responses is None:
        responses = teacher_responses(target, prompts, new_tokens, eos_ids, progress=progress)
    write_shard(teacher_dir, f"prompts-{digest}", "user prompts", "the user's",
                [Conversation(p, r) for p, r in zip(prompts, responses)],
                {"decoding": f"greedy, <= {new_tokens} tokens", "dtype": str(target.dtype).removeprefix("torch.")})


def train_cached(drafter: BlockDrafter, target: TargetModel, prompts: list[list[int]], eval_prompts: list[list[int]],
                 cfg: CachedTrainConfig, out_dir: Path, cache_dir: Path, target_source: str, new_tokens: int,
                 top_k: int = 64, eos_ids: frozenset[int] = frozenset(), responses: list[list[int]] | None = None,
                 progress: bool = True) -> dict:
    """Teacher shard -> teacher cache -> `fit_cached` -> published drafter + training.json + plot."""
    out_dir.mkdir(parents=True, exist_ok=True)
    teacher_shard(target, prompts, new_tokens, out_dir / "teacher", eos_ids, responses, progress)
    layers = sorted(set(drafter.config.target_layer_ids))
    try:
        spec = spec_for(target, out_dir / "teacher", layers, top_k, target_identity(target, target_source))
    except ValueError as e:                   # a bad --top-k: one line, naming the field
        raise RequestError(str(e)) from None
    cache = TapCache.open(build(target, out_dir / "teacher", cache_dir, spec, progress), spec)
    t0 = time.perf_counter()
    last = target.config.num_layers - 1
    state = fit_cached({drafter.config.kind: drafter}, cache, cfg, out_dir / "state.pt", last)
    history = state.history[drafter.config.kind]
    summary = {"config": asdict(cfg), "train_seconds": time.perf_counter() - t0, "history": history,
               "teacher_sequences": len(cache), "teacher_cache": str(cache_dir), "top_k": top_k,
               "blocks_trained": sum(h["blocks"] for h in history),
               "final_loss": history[-1]["loss"] if history else None,
               "validation_mean_al": mean_acceptance(target, drafter, eval_prompts, new_tokens)}
    save_drafter(drafter, target, out_dir)
    (out_dir / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    _plot(history, out_dir / "training.png", summary["validation_mean_al"])
    return summary
