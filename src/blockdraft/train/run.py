"""`blockdraft train` end to end for a user's target: teacher data, teacher cache, cached steps, output.

The target's greedy responses to the prompts become a teacher shard in `out_dir/teacher`
(made once: a rerun reuses them), one teacher-forced pass per sequence fills the teacher cache
(outside `out_dir`, under `cache_dir`), and `cached.fit_cached` trains the drafter from it,
resumable through `out_dir/state.pt`. At the end `out_dir` holds the drafter in its published
layout, `training.json` (config, loss history, teacher-forced and engine acceptance on the held-out
prompts) and `training.png`. `train_drafter` runs a `DrafterTrainJob` (the prompts encoded and split,
the drafter built) through `train_cached`; the CLI only parses flags into the job.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
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


@dataclass(frozen=True)
class DrafterTrainJob:
    """What `blockdraft train` asks for: a new drafter of `kind` for `target`, distilled from the target's
    greedy responses to `prompts` (a file, or builtin[:N]) by the cached-teacher recipe `config`."""

    target: str
    kind: str
    prompts: str
    out: Path
    config: CachedTrainConfig
    taps: tuple[int, ...]
    eval_prompts: str | None = None       # held-out prompts (default: the last 10% of `prompts`)
    chat: bool = False                    # builtin prompts are always chat-templated
    layers: int = 1
    block_size: int = 8
    markov_rank: int = 64
    mask_token_id: int | None = None      # default: the last tokenizer id
    draft_vocab: int | None = None        # prune to the N ids most frequent in the teacher responses
    new_tokens: int = 64
    top_k: int = 64
    cache_dir: Path | None = None         # default: $BLOCKDRAFT_CACHE/teacher-cache/<digest of out>
    quiet: bool = False


def train_drafter(job: DrafterTrainJob) -> dict:
    """Load the target (float32), encode and split the prompts, build the drafter and train it into
    `job.out` (resumable); returns `train_cached`'s summary."""
    from ..checkpoints.publish import new_drafter
    from ..default_model import cache_root
    from ..llm import LLM
    from ..loading import check_drafter_fits
    from .prompts import builtin_prompts, read_prompts, split_held_out
    from .vocab import choose_draft_vocab, token_counts

    builtin = job.prompts.startswith("builtin")
    llm = LLM(target=job.target, drafter="none", dtype="float32", max_batch=32 if builtin else 1)
    encode = (lambda text: llm.encode(text, chat=job.chat or builtin))
    prompts = [encode(p) for p in (builtin_prompts(llm, job.prompts) if builtin else read_prompts(job.prompts))]
    given = [encode(p) for p in read_prompts(job.eval_prompts)] if job.eval_prompts else None
    prompts, held_out = split_held_out(prompts, given)
    if not prompts:
        raise RequestError(f"{job.prompts} gives no training prompts after holding out evaluation prompts")
    mask = job.mask_token_id
    if mask is None:
        mask = llm.tokenizer.vocab_size - 1 if llm.tokenizer else llm.target.config.vocab_size - 1
    eos = llm._eos_ids()
    responses = vocab = None
    if job.draft_vocab is not None:
        responses = teacher_responses(llm.target, prompts, job.new_tokens, eos, progress=not job.quiet)
        vocab = choose_draft_vocab(token_counts(responses, llm.target.config.vocab_size), job.draft_vocab,
                                   always=eos).ids
    drafter = new_drafter(llm.target, job.kind, job.layers, job.block_size, job.taps, mask,
                          markov_rank=job.markov_rank, seed=job.config.seed, draft_vocab=vocab)
    check_drafter_fits(drafter.config, llm.target.config, {})
    out = Path(job.out)
    cache_dir = job.cache_dir or cache_root() / "teacher-cache" / hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:16]
    return train_cached(drafter, llm.target, prompts, held_out, job.config, out, cache_dir, str(job.target),
                        job.new_tokens, job.top_k, eos, responses, progress=not job.quiet)
