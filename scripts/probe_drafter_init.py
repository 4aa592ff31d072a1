"""Probe: how a drafter's initialisation and loss weighting change what a short run learns.

Trains one kind (default DSpark) for a few hundred steps from the committed teacher shards with
the shipped recipe, under several variants, and scores each by its teacher-forced expected
acceptance length on the held-out eval sets: the target's greedy responses to the bench's chat,
code and math prompts, every response position an anchor, AL = 1 + sum_k P(slots 1..k all equal
the target's tokens). For greedy decoding this is exactly what a step anchored there accepts
(the drafter's context is the target's taps of the committed tokens; DSpark's Markov input is the
previous token, which equals the drafted one while the prefix is right). `--baselines` scores the
shipped drafters and a trigram table of the same teacher data the same way (what counting alone
gives).

    python scripts/probe_drafter_init.py --variants random,target-last,fc-scaled --steps 200
    python scripts/probe_drafter_init.py --variants random --gamma 1 --steps 200
    python scripts/probe_drafter_init.py --baselines

Results accumulate in `--out` (default docs/data/drafter_probe.json).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from blockdraft.train import recipe

ROOT = Path(__file__).resolve().parents[1]


def init_from_target(drafter, target, layers: list[int], fc_tap: int | None) -> None:
    """Drafter layer i <- target layer layers[i] (attention, MLP, norms; Qwen3 q/k norms left at 1);
    `fc_tap`: the context projection starts as the identity on that tap (index into the taps)."""
    with torch.no_grad():
        for mine, theirs in zip(drafter.layers, (target.layers[i] for i in layers)):
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(mine.self_attn, name).weight.copy_(getattr(theirs.self_attn, name).weight.float())
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(mine.mlp, name).weight.copy_(getattr(theirs.mlp, name).weight.float())
            mine.input_layernorm.weight.copy_(theirs.input_layernorm.weight.float())
            mine.post_attention_layernorm.weight.copy_(theirs.post_attention_layernorm.weight.float())
        drafter.norm.weight.copy_(target.norm.weight.float())
        if fc_tap is not None:
            h = drafter.config.hidden_size
            drafter.fc.weight.mul_(0.1)
            drafter.fc.weight[:, fc_tap * h:(fc_tap + 1) * h] += torch.eye(h)


def forced_with_taps(drafter, target, seqs) -> list[tuple]:
    """Each sequence teacher-forced by the target, with this drafter's packed taps [1, L, F]."""
    from blockdraft.train.trainer import _joint_taps, _taps_for, teacher_force

    joint = _joint_taps({"d": drafter}, target)
    return [(seq, _taps_for(drafter, seq, joint, target.config.num_layers - 1))
            for seq in teacher_force(target, seqs, joint)]


@torch.no_grad()
def init_fc_by_tap_scale(drafter, target, seqs) -> None:
    """Scale the context projection's columns by 1/RMS of their tap channel (measured on `seqs`), so
    every channel starts with an equal say: SmolLM2's taps hold massive activations (channel 507 has
    RMS ~1,600 at layers 15 and 22 against a median of 5-9) that otherwise fill the projected context."""
    taps = torch.cat([t[0] for _, t in forced_with_taps(drafter, target, seqs)]).float()   # [N, F]
    rms = taps.pow(2).mean(0).sqrt().clamp_min(1e-3)                                   # [F]
    w = torch.randn(drafter.fc.weight.shape, generator=torch.Generator().manual_seed(0)) / rms.shape[0] ** 0.5
    drafter.fc.weight.copy_(w / rms)


def eval_sequences(llm, tokens: int):
    from blockdraft.train.trainer import TeacherSeq, teacher_responses

    prompts = recipe.eval_prompts(llm)
    out = {}
    for name, ids in prompts.items():
        responses = teacher_responses(llm.target, ids, tokens)
        out[name] = [TeacherSeq(torch.tensor(p + r), None, None, len(p)) for p, r in zip(ids, responses)]
    return out


@torch.no_grad()
def forced_al(drafter, target, seqs) -> tuple[float, list[float]]:
    """Teacher-forced expected AL over every response anchor, and P(slot k right | slots < k right)."""
    from blockdraft.train.losses import blocks_at

    n = drafter.config.num_draft_tokens
    prefix_sum, anchors_total = torch.zeros(n), 0
    for seq, taps in forced_with_taps(drafter, target, seqs):
        lo, hi = seq.anchor_range
        anchors = torch.arange(lo, hi - n)          # full blocks only
        block = blocks_at(drafter, taps, seq.final, seq.ids, anchors)
        z = drafter.logits(block.hidden).float()
        if drafter.config.kind == "dspark":
            z = z + drafter.markov_head(block.prev)[0]
        right = (drafter.to_target(z.argmax(-1)) == block.labels).view(len(anchors), n)
        prefix_sum += right.int().cumprod(1).sum(0).float()
        anchors_total += len(anchors)
    reach = prefix_sum / anchors_total                # P(AL > k)
    cond = [float(reach[0])] + [float(reach[k] / reach[k - 1].clamp_min(1e-9)) for k in range(1, n)]
    return 1 + float(reach.sum()), cond


def ngram_al(train, seqs, n: int = 3, block: int = 8) -> float:
    """Teacher-forced AL of a drafter that continues with the most frequent next token after the
    longest of the last n..1 tokens seen in the teacher responses (its own guesses fed back)."""
    from collections import Counter, defaultdict

    counts = [defaultdict(Counter) for _ in range(n + 1)]
    for s in train:
        ids = s.ids.tolist()
        for t in range(max(s.response_start, n), len(ids)):
            for k in range(1, n + 1):
                counts[k][tuple(ids[t - k:t])][ids[t]] += 1
    best = [{key: c.most_common(1)[0][0] for key, c in table.items()} for table in counts]

    def guess(ctx):
        return next((best[k][tuple(ctx[-k:])] for k in range(n, 0, -1) if tuple(ctx[-k:]) in best[k]), None)

    reach, anchors = 0, 0
    for s in seqs:
        ids = s.ids.tolist()
        for a in range(s.response_start - 1, len(ids) - 1 - block):
            ctx, anchors = ids[:a + 1], anchors + 1
            for k in range(block):
                if guess(ctx) != ids[a + 1 + k]:
                    break
                reach, ctx = reach + 1, ctx + [ids[a + 1 + k]]
    return 1 + reach / anchors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="random,target-last,fc-scaled")
    ap.add_argument("--kind", default="dspark")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--gamma", type=float, default=4.0, help="loss weight of slot k: exp(-k / gamma)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--out", default=str(ROOT / "docs" / "data" / "drafter_probe.json"))
    ap.add_argument("--baselines", action="store_true",
                    help="score the shipped drafters and a trigram table instead of training")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from blockdraft.train.trainer import fit_jointly

    out = Path(args.out)
    work = Path("/tmp") / "probe_drafter_state"          # resumable run states, never in git
    work.mkdir(parents=True, exist_ok=True)
    llm = recipe.load_llm()
    seqs, _ = recipe.teacher_sequences(ROOT / recipe.TEACHER_DATA)
    evals = eval_sequences(llm, recipe.EVAL_TOKENS)
    results = json.loads(out.read_text()) if out.is_file() else {}
    if args.baselines:
        from blockdraft.loading import load_drafter

        for kind in recipe.KINDS:
            d = load_drafter(recipe.ASSETS / kind, llm.target).float()
            results[f"shipped-{kind}"] = {name: forced_al(d, llm.target, s)[0] for name, s in evals.items()}
        results["trigram"] = {name: ngram_al(seqs, s) for name, s in evals.items()}
        out.write_text(json.dumps(results, indent=1) + "\n")
        for key in [f"shipped-{k}" for k in recipe.KINDS] + ["trigram"]:
            print(key, {k: round(v, 3) for k, v in results[key].items()})
        return
    for variant in args.variants.split(","):
        torch.manual_seed(0)
        name = variant if args.gamma == 4.0 else f"{variant}-gamma{args.gamma:g}"
        drafters, _ = recipe.new_drafters(llm, seqs, sorted(llm._eos_ids()), kinds=(args.kind,))
        drafter = drafters[args.kind]
        last = llm.target.config.num_layers - 1
        if variant == "target-last":
            init_from_target(drafter, llm.target, list(range(last - len(drafter.layers) + 1, last + 1)), fc_tap=4)
        elif variant == "fc-scaled":
            init_fc_by_tap_scale(drafter, llm.target, seqs[-8:])
        elif variant != "random":
            raise SystemExit(f"unknown variant {variant}")
        cfg = replace(recipe.run_config(args.steps, args.lr), warmup=args.warmup, save_every=args.eval_every,
                      position_gamma=args.gamma,
                      save_every_seconds=10 ** 9)
        rows = []
        t0 = time.time()
        state = work / f"{name}.pt"
        state.unlink(missing_ok=True)

        def score(step, models):
            d = models[args.kind].eval()
            sets = {name: forced_al(d, llm.target, s) for name, s in evals.items()}
            rows.append({"step": step, "seconds": time.time() - t0,
                         "sets": {k: {"al": v[0], "cond": v[1]} for k, v in sets.items()}})
            print(f"{name} step {step} ({time.time() - t0:.0f} s): "
                  + ", ".join(f"{k} {v[0]:.3f} (p1 {v[1][0]:.2f})" for k, v in sets.items()), flush=True)
            results[name] = rows
            out.write_text(json.dumps(results, indent=1) + "\n")

        fit_jointly({args.kind: drafter}, seqs, cfg, state, progress=False, head=recipe.fp32_head(llm.target),
                    target=llm.target, on_checkpoint=score)


if __name__ == "__main__":
    main()
