"""Drafter training throughput: blocks trained per second by the shipped SmolLM2 drafters' recipe
(`train/recipe.py`: DSpark and DFlash on the same batches), three ways side by side in one process.

    python benchmarks/bench_train.py [--steps 5] [--repeats 1] [--threads 1] [--shards stdlib_rewrite_00 | --cache [DIR]]
        [--layers 2] [--seqs-per-step 4] [--blocks-per-seq 0]

  per-step teacher  the bf16 target teacher-forces each step's sequences (`trainer.fit_jointly`:
                    2 sequences x 48 anchors a step, `recipe.run_config`)
  cached bf16       steps drawn from the teacher cache (`cached.fit_cached`: `--seqs-per-step` sequences,
                    every response position or `--blocks-per-seq` of them), bf16 autocast over fp32 weights
  cached fp32       the same in fp32
Each round runs every recipe on new drafters: one untimed step, then `--steps` timed ones. The teacher
cache is built, untimed, in a temporary folder from `--shards` of the committed teacher data
(data/teacher/smollm2), or `--cache [DIR]` opens one that `scripts/train_cached_drafters.py cache` built
(every shard it holds; no DIR: $BLOCKDRAFT_CACHE/teacher-cache-smollm2). Writes benchmarks/results/train.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from harness import ROOT, add_repeats, add_threads, clock, run_commands, side_by_side, write_results

TOP_K = 64            # the teacher distribution kept per position, as the shipped drafters' cache keeps it


def built_cache(root: Path):
    """The teacher cache in `root` with every shard it has finished, as its own manifest describes it."""
    from blockdraft.train.tap_cache import CacheSpec, TapCache

    stored = json.loads((root / "manifest.json").read_text())
    done = tuple((f, sha) for f, sha in stored["shards"] if (root / Path(f).stem / "done.json").is_file())
    spec = CacheSpec(stored["target"], tuple(stored["tap_layers"]), stored["top_k"], stored["hidden_size"],
                     stored["vocab_size"], stored["dtype"], done)
    return TapCache.open(root, spec)


def new_cache(target, shards: list[str], root: Path):
    """A teacher cache of `shards` (file stems) of the committed teacher data, built in `root`."""
    from blockdraft.train import recipe
    from blockdraft.train.shards import read_manifest
    from blockdraft.train.tap_cache import TapCache, build, spec_for

    data = ROOT / recipe.TEACHER_DATA
    spec = spec_for(target, data, recipe.TAPS, TOP_K, read_manifest(data)["target"])
    files = {Path(f).stem: (f, sha) for f, sha in spec.shards}
    if unknown := [s for s in shards if s not in files]:
        sys.exit(f"--shards {','.join(unknown)}: not in {data} (it holds {', '.join(files)})")
    spec = replace(spec, shards=tuple(files[s] for s in shards))
    build(target, data, root, spec)
    return TapCache.open(root, spec)


def flags(ap) -> None:
    ap.add_argument("--steps", type=int, default=5, help="timed steps per recipe and round")
    add_repeats(ap, 1)
    add_threads(ap, 1)
    ap.add_argument("--shards", default="stdlib_rewrite_00", help="teacher shards to cache (file stems)")
    ap.add_argument("--cache", nargs="?", const="", default=None,
                    help="train from a built teacher cache instead of --shards (no value: the one "
                    "scripts/train_cached_drafters.py builds, $BLOCKDRAFT_CACHE/teacher-cache-smollm2)")
    ap.add_argument("--layers", type=int, default=2, help="drafter layers")
    ap.add_argument("--seqs-per-step", type=int, default=4, help="cached recipes: sequences a step")
    ap.add_argument("--blocks-per-seq", type=int, default=0, help="cached recipes: anchors a sequence (0: every one)")


def train(args) -> None:
    """Blocks per second of each recipe."""
    from blockdraft.default_model import cache_root
    from blockdraft.numerics import cpu_model
    from blockdraft.train import recipe
    from blockdraft.train.cached import CachedTrainConfig, fit_cached
    from blockdraft.train.trainer import TeacherSeq, fit_jointly

    llm = recipe.load_llm()
    last = llm.target.config.num_layers - 1
    with tempfile.TemporaryDirectory() as tmp:
        if args.cache is None:
            cache = new_cache(llm.target, args.shards.split(","), Path(tmp) / "cache")
        else:
            cache = built_cache(Path(args.cache) if args.cache else cache_root() / "teacher-cache-smollm2")
        seqs = [TeacherSeq(cache.seq(i).ids, None, None, cache.seq(i).response_start) for i in range(len(cache))]

        def new_drafters():
            torch.manual_seed(0)
            return recipe.new_drafters(llm, seqs, sorted(llm._eos_ids()), args.layers)[0]

        def per_step_teacher() -> tuple[float, int]:
            drafters, cfg = new_drafters(), recipe.run_config(args.steps + 1)

            def fit(**changes):
                fit_jointly(drafters, seqs, replace(cfg, **changes), None, progress=False,
                            head=recipe.fp32_head(llm.target), target=llm.target)
            fit(steps=1, save_every=10 ** 9)
            seconds, _ = clock(lambda: fit(steps=args.steps, first_draw=cfg.seqs_per_step))
            return seconds, args.steps * cfg.seqs_per_step * cfg.anchors_per_seq

        def cached(bf16: bool):
            def run() -> tuple[float, int]:
                drafters = new_drafters()
                cfg = CachedTrainConfig(steps=args.steps + 1, seqs_per_step=args.seqs_per_step,
                                        blocks_per_seq=args.blocks_per_seq, bf16=bf16, save_every_seconds=10 ** 9)
                state = Path(tmp) / f"state-{'bf16' if bf16 else 'fp32'}.pt"
                state.unlink(missing_ok=True)
                fit_cached(drafters, cache, cfg, state, last, stop_at=1)
                seconds, done = clock(lambda: fit_cached(drafters, cache, cfg, state, last))
                return seconds, sum(h["blocks"] for h in done.history[recipe.KINDS[0]][1:])
            return run

        runs = side_by_side({"per-step teacher": per_step_teacher, "cached bf16": cached(True),
                             "cached fp32": cached(False)}, args.repeats)
    report = {"cpu": cpu_model(), "threads": torch.get_num_threads(), "sequences": len(cache),
              "shards": [f for f, _ in cache.spec.shards], "kinds": list(recipe.KINDS), "rounds": args.repeats}
    for name, per in runs.items():
        rates = [blocks / seconds for seconds, blocks in per]
        report[name] = {"steps": args.steps, "blocks": per[-1][1], "seconds": statistics.median(s for s, _ in per),
                        "blocks_per_s": statistics.median(rates), "blocks_per_s_rounds": rates}
        print(f"{name}: {per[-1][1]} blocks in {report[name]['seconds']:.1f} s = {report[name]['blocks_per_s']:.1f} "
              f"blocks/s ({'+'.join(recipe.KINDS)} on the same batches)", flush=True)
    write_results("train", report)
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(run_commands(__doc__, {}, default=(flags, train)))
