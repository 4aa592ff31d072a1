"""`blockdraft train`: a drafter distilled from the target's own greedy text (the cached-teacher recipe)."""

from __future__ import annotations

import argparse
import json

from ..drafters import registry as drafter_kinds
from .args import HelpFormatter, id_list, threads_arg, use_threads


def add_parser(sub) -> None:
    t = sub.add_parser("train", help="distil a DFlash or DSpark drafter from a target's own greedy text",
                       formatter_class=HelpFormatter,
                       description="Train a drafter on the target's greedy continuations of a prompt set "
                       "(one prompt per line, or JSONL with a 'prompt' field). The target runs once per sequence "
                       "(taps and its top-k next-token distribution go to a teacher cache outside --out); steps "
                       "then train from the cache. Resumable: rerun with the same --out to continue. Writes the "
                       "published layout, training.json and training.png. The target runs in float32 here. "
                       "DFlash2 drafters are not trained by blockdraft (no loss for their candidate selector); "
                       "they run when published elsewhere.")
    t.add_argument("--target", required=True, help="HF target directory, or 'smollm2'")
    t.add_argument("--kind", choices=drafter_kinds.NAMES, default=drafter_kinds.DEFAULT_KIND,
                   help="drafter kind to train (a kind without a loss here is refused by name)")
    t.add_argument("--prompts", required=True, help="training prompts (.txt lines or .jsonl), or builtin[:N] for "
                   "N prompts from the offline sources in train/prompts.py (self-instruct, stdlib docstrings, "
                   "templated arithmetic; implies --chat)")
    t.add_argument("--eval-prompts", help="held-out prompts for the validation AL (default: last 10%%)")
    t.add_argument("--out", required=True, help="output directory (holds the resume state too)")
    t.add_argument("--layers", type=int, default=1, help="drafter decoder layers")
    t.add_argument("--block-size", type=int, default=8, help="drafter block (DSpark: drafts per step; DFlash: "
                   "drafts + 1)")
    t.add_argument("--taps", type=id_list, required=True, help="target layer ids to tap, e.g. 1,14,28")
    t.add_argument("--markov-rank", type=int, default=64, help="DSpark Markov head rank")
    t.add_argument("--mask-token-id", type=int, help="id of the block's mask token (default: the last "
                   "tokenizer id)")
    t.add_argument("--draft-vocab", type=int, help="prune the drafter's vocabulary to the N ids most frequent in "
                   "the teacher responses (plus EOS): a smaller LM head (default: the target's whole vocabulary)")
    t.add_argument("--steps", type=int, default=200, help="optimizer steps")
    t.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    t.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                   help="after warmup: constant, or cosine decay to 10%% of --lr")
    t.add_argument("--warmup", type=int, default=10, help="linear warmup steps")
    t.add_argument("--seqs-per-step", type=int, default=2, help="teacher sequences per step")
    t.add_argument("--blocks-per-seq", type=int, default=0,
                   help="blocks (anchors) drawn from each sequence per step; 0 = every response position")
    t.add_argument("--position-gamma", type=float, default=4.0,
                   help="loss weight of draft slot k: exp(-k / gamma) (inf: every slot alike)")
    t.add_argument("--top-k", type=int, default=64, help="the target's next-token distribution kept per position")
    t.add_argument("--cache-dir", help="teacher cache (default: $BLOCKDRAFT_CACHE/teacher-cache/<digest of --out>)")
    t.add_argument("--fp32", action="store_true", help="train in float32 (default: bf16 autocast, fp32 weights)")
    t.add_argument("--seed", type=int, default=0, help="seed of the drafter init, draws and anchors")
    t.add_argument("--save-every-seconds", type=float, default=600.0, help="checkpoint at least this often")
    t.add_argument("--new-tokens", type=int, default=64, help="target tokens generated per prompt")
    t.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    threads_arg(t)
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    t.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..errors import RequestError
    from ..train.cached import CachedTrainConfig
    from ..train.run import DrafterTrainJob, train_drafter

    drafter_kinds.training_of(args.kind)        # a kind without a loss here: a named error before any work
    use_threads(args)
    try:
        cfg = CachedTrainConfig(steps=args.steps, lr=args.lr, warmup=args.warmup, schedule=args.schedule,
                                seqs_per_step=args.seqs_per_step, blocks_per_seq=args.blocks_per_seq, seed=args.seed,
                                position_gamma=args.position_gamma, bf16=not args.fp32,
                                save_every_seconds=args.save_every_seconds)
    except ValueError as e:
        raise RequestError(str(e)) from None
    summary = train_drafter(DrafterTrainJob(
        target=args.target, kind=args.kind, prompts=args.prompts, out=Path(args.out), config=cfg,
        taps=tuple(args.taps), eval_prompts=args.eval_prompts, chat=args.chat, layers=args.layers,
        block_size=args.block_size, markov_rank=args.markov_rank, mask_token_id=args.mask_token_id,
        draft_vocab=args.draft_vocab, new_tokens=args.new_tokens, top_k=args.top_k,
        cache_dir=Path(args.cache_dir) if args.cache_dir else None, quiet=args.quiet))
    print(json.dumps({"out": args.out, "final_loss": summary["final_loss"],
                      "validation_mean_al": summary["validation_mean_al"],
                      "train_seconds": summary["train_seconds"]}))
    return 0
