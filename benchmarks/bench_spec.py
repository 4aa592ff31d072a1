"""Speculation end to end: the engine with a drafter against plain decoding of the same numerics, side
by side in one process — at a controlled acceptance on family-shaped targets, on the tiny fixtures at
batch 1-16, over many short rounds, with a fresh or a remembered width policy, and under tensor
parallelism.

    python benchmarks/bench_spec.py controlled [--families lfm2,qwen3.5,smollm2] [--als 1.5,2,3,4,5 | --rates 0.5,0.7]
        [--batches 1,4] [--numerics int4] [--draft-vocab N] [--repeats 3] [--prompt 300] [--tokens 64] [--threads 2]
        [--name spec]
    python benchmarks/bench_spec.py engine [--repeats 3] [--tokens 48] [--no-adaptive] [--out engine]
    python benchmarks/bench_spec.py policy-ab [--rounds 16] [--batch 6] [--quantization none|int4]
        [--explore-share S] [--min-gap N] [--drafters dspark,dspark-plain,dflash]
    python benchmarks/bench_spec.py widths [--widths 1,2,3,4,8] [--prompts 6] [--tokens 64] [--repeats 3]
    python benchmarks/bench_spec.py width-memory [--prompts 4] [--tokens 96] [--repeats 2] [--drafter dspark]
    python benchmarks/bench_spec.py tp [--prompts 4] [--tokens 64] [--repeats 3] [--dtype bfloat16] [--tp 3]

Sub-commands (`bench_spec.py COMMAND --help` for each):
  controlled    a controlled-acceptance drafter on family-shaped random targets: speed vs plain per
                acceptance, width policy and full block (NAME.json, docs/data/NAME.png; NAME = spec)
  engine        batch-engine throughput, plain vs each drafter at batch 1-16, tiny fixtures (engine.json, .png)
  policy-ab     the width policy against plain decoding, many short rounds, default model (policy_ab.json)
  widths        the default model's step at each held drafting width: verify, drafter pass, context
                writes, and what it buys against plain decoding (widths.json)
  width-memory  one request per new engine: a fresh width policy vs a remembered one vs plain
                (width_memory.json, docs/data/width_memory.png)
  tp            TP=1 vs TP=N on the default model, plain and DSpark, gloo on this CPU (tp.json)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from harness import (RESULTS, add_prompts, add_repeats, add_threads, chat_prompts, clock, median_ratio, new_figure,
                     ratios, round_order, run_commands, save_figure, shaped, shaped_configs, side_by_side,
                     tiny_prompts, write_results)


# --- controlled ----------------------------------------------------------------------------------

BLOCK = 8
MARKOV_RANK = 128
MARKOV_SCALE = 400.0    # the known chain's bias: far above the drafter's own logits (up to sqrt(hidden) ~ 45 at
                        # LFM2's width, where the target's head rows are unit embedding directions) and the
                        # other codes' cross terms (std MARKOV_SCALE / sqrt(rank))
EMBED_SCALE = 10.0      # embedding rows against the random layers' residual updates (RMS ~1)


def chained_target(cfg, numerics: str, perm: torch.Tensor):
    """A shaped random target whose greedy next token after t is perm[t] (an untied LM head)."""
    from blockdraft.layers.quant import quantize_target
    from blockdraft.models.qwen3_5 import OffsetRMSNorm
    model = shaped(dataclasses.replace(cfg, tie_word_embeddings=False))
    with torch.no_grad():
        embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
        unit = embed / embed.norm(dim=-1, keepdim=True)
        model.embed_tokens.weight.copy_(embed * EMBED_SCALE)
        head = torch.empty_like(unit)
        head[perm] = unit                      # row perm[t] points along t: score ~ sqrt(hidden) for it
        model.lm_head.weight.copy_(head)
        model.norm.weight.fill_(0.0 if isinstance(model.norm, OffsetRMSNorm) else 1.0)   # gain 1
    return model if numerics in ("bf16", "none") else quantize_target(model, numerics)


def chained_perm(vocab: int, draft_vocab: torch.Tensor | None) -> torch.Tensor:
    """A fixed random permutation σ of the vocabulary; with a draft vocabulary (sorted ids), one that maps
    it onto itself (and the other ids onto theirs), so that a continuation which starts in it stays in it."""
    g = torch.Generator().manual_seed(3)
    if draft_vocab is None:
        return torch.randperm(vocab, generator=g)
    rest = torch.ones(vocab, dtype=torch.bool)
    rest[draft_vocab] = False
    perm = torch.empty(vocab, dtype=torch.long)
    for ids in (draft_vocab, rest.nonzero()[:, 0]):
        perm[ids] = ids[torch.randperm(len(ids), generator=g)]
    return perm


def draft_ids(vocab: int, size: int) -> torch.Tensor | None:
    """`size` sorted random token ids (the controlled drafter's draft vocabulary), or None for 0 (the whole
    vocabulary)."""
    if not 0 <= size <= vocab:
        raise SystemExit(f"--draft-vocab {size}: 0 (the whole vocabulary) or a size up to {vocab}")
    if size in (0, vocab):
        return None
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(4))[:size].sort().values


def chained_drafter(target, perm: torch.Tensor, rate: float, draft_vocab: torch.Tensor | None = None):
    """A DSpark drafter whose Markov head knows t -> perm[t] for a share `rate` of the tokens t, in its
    target's weight-only scheme as `load_drafter` puts it. With `draft_vocab` (sorted target ids, mapped
    onto itself by `perm`) its logits and Markov head cover only those ids, as a pruned drafter's do
    (its own LM head: the target's rows for them)."""
    from blockdraft.checkpoints.publish import new_drafter
    from blockdraft.layers.quant import quantize_drafter, scheme_of
    n, vocab = target.config.num_layers, target.config.vocab_size
    drafter = new_drafter(target, "dspark", 1, BLOCK, (1, n // 2, n - 2), mask_token_id=0, markov_rank=MARKOV_RANK,
                          draft_vocab=draft_vocab)
    g = torch.Generator().manual_seed(2)
    codes = torch.randn(vocab, MARKOV_RANK, generator=g)
    codes = codes / codes.norm(dim=-1, keepdim=True)                    # [vocab, rank], unit rows
    unknown = torch.rand(vocab, generator=g) >= rate
    w1 = torch.where(unknown[:, None], -codes, codes)     # an unknown t's bias holds perm[t] at -scale
    w2 = torch.empty_like(codes)
    w2[perm] = codes * MARKOV_SCALE                                     # bias(t)[perm[t]] = scale for a known t
    if draft_vocab is not None:
        w2 = w2[draft_vocab]                                            # [draft vocab, rank]: rows by draft id
    head = drafter.markov_head
    with torch.no_grad():
        head.markov_w1.weight.copy_(w1)
        head.markov_w2.weight.copy_(w2)
    return quantize_drafter(drafter, scheme_of(target))


def rate_for(al: float) -> float:
    """The per-slot rate a whose full-block mean acceptance length 1 + a + ... + a^(BLOCK-1) is `al`."""
    if not 1.0 <= al < BLOCK:
        raise SystemExit(f"--als {al}: a mean acceptance length in [1, {BLOCK}) at block {BLOCK}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        lo, hi = (a, hi) if sum(a ** i for i in range(BLOCK)) < al else (lo, a)
    return round((lo + hi) / 2, 4)


def decode_run(eng, prompts: list[list[int]], tokens: int) -> dict:
    """Decode tokens/s (the tokens after each sequence's first, over the longest first-token-to-finish
    time: the prefill is not in it) and end-to-end tokens/s (prefill included)."""
    from blockdraft.sampling.params import SamplingParams
    seconds, outs = clock(lambda: eng.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True)))
    als = [a for o in outs for a in o.acceptance_lengths]
    return {"tok_s": sum(len(o.token_ids) - 1 for o in outs) / max(o.decode_s for o in outs),
            "end_to_end_tok_s": sum(len(o.token_ids) for o in outs) / seconds, "tokens": [o.token_ids for o in outs],
            "als": als, "width": sum(o.drafted for o in outs) / max(len(als), 1)}


def slot_rates(als: list[int]) -> list[float]:
    """From full-width steps' acceptance lengths: P(slot i accepted | slots before it were), i = 1..block."""
    reached = [sum(a - 1 >= i for a in als) for i in range(BLOCK + 1)]
    return [reached[i] / reached[i - 1] if reached[i - 1] else float("nan") for i in range(1, BLOCK + 1)]


def plot(report: dict, name: str) -> None:
    """docs/data/NAME.png: speed against plain per measured full-block AL, the policy and full width per target."""
    if not (made := new_figure(figsize=(7.5, 4.2))):
        return
    fig, ax = made
    rates = report["rates"]
    for k, (model, row) in enumerate(report["models"].items()):
        full = [row[f"width {BLOCK} a={a}"]["mean_al"] if f"width {BLOCK} a={a}" in row   # measured, else nominal
                else sum(a ** i for i in range(BLOCK)) for a in rates]
        for kind, style in (("policy", "-o"), (f"width {BLOCK}", "--x")):
            if f"{kind} a={rates[0]}" in row:
                ax.plot(full, [row[f"{kind} a={a}"]["vs_plain"] for a in rates], style, color=f"C{k}",
                        label=f"{model}, {kind}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel(f"mean acceptance length at the full block {BLOCK} (controlled-acceptance drafter)")
    ax.set_ylabel("decode tokens/s vs plain decoding")
    ax.set_title(f"end to end, {report['numerics']}, {report['threads']} thread(s), {report['cpu']} ({report['isa']})",
                 fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, name)


def controlled_flags(ap) -> None:
    ap.add_argument("--families", default="lfm2,qwen3.5,smollm2")
    ap.add_argument("--als", default="1.5,2,3,4,5", help="mean acceptance lengths at the full block")
    ap.add_argument("--rates", default=None, help="per-slot acceptance rates instead of --als")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--numerics", default="int4")
    ap.add_argument("--modes", default="policy,width", help="which speculative modes run: the width policy, the full width")
    ap.add_argument("--draft-vocab", type=int, default=0,
                    help="the drafter's draft vocabulary size (0: the whole vocabulary); prompts and the target's "
                         "continuation then use those ids only")
    add_repeats(ap, 3)
    ap.add_argument("--prompt", type=int, default=300, help="prompt tokens")
    add_prompts(ap, None, 64)
    add_threads(ap, 2)
    ap.add_argument("--name", default="spec", help="results name: benchmarks/results/NAME.json, docs/data/NAME.png")


def controlled(args) -> None:
    """Speculative decoding at a controlled acceptance: measured speed against plain decoding, with the
    width policy deciding and at the full block, on family-shaped targets.

    The drafter is a *controlled-acceptance drafter*: it proposes the target's own greedy continuation
    with a set probability per slot. `--als` asks for mean acceptance lengths at the full block
    (per-slot rate a with 1 + a + ... + a^(block-1) = AL); `--rates` gives a directly. The measured AL
    is reported beside the asked one. `bench_costs.py moe-width` predicts the policy's width from timed
    passes and an assumed acceptance; this runs the engine. Each family-shaped random target
    (`harness.shaped_configs`: LFM2-1.2B and a Qwen3.5 shape, SmolLM2-135M's, the MoE shapes) is given a
    known greedy continuation: its LM head scores token σ(t) highest after token t, for a fixed random
    permutation σ (the head's row σ(t) is t's embedding direction; the embedding is large against the
    layers' random updates, so the last token decides). A 1-layer DSpark drafter (block 8) is built to
    know that chain for a share a of the vocabulary: its Markov head's W1[t] · W2[σ(t)] is large for a
    "known" t and as large negative for an unknown one (which the drafter's own hidden-state guess, read
    through the target's head, cannot outweigh). Slot i of a block is then accepted with probability
    about aⁱ, as `moe-width` assumes, and each drafted token really runs through the drafter, the
    target's verify pass over the union of the rows' experts, and the rollback. `--draft-vocab N` gives
    the drafter a pruned vocabulary of N random ids (its own LM head: the target's rows for them, and a
    Markov head over them; the layout blockdraft's DSpark recipe trains and EAGLE-3 drafters ship), σ maps
    those ids onto themselves and the prompts are drawn from them, so the continuation stays draftable:
    what changes is what the drafter's logits and Markov chain cost a step, not the acceptance.

    For each target, batch size and a, in one process and interleaved by repeat (each repeat its own
    random prompts, one per sequence of the batch): the engine with its width policy on (`EngineConfig`
    defaults; one untimed warm-up request first, so the policy has measured its costs and acceptance, as
    a running server's has) and the engine held at the full width 8 (`--modes`), each run right beside a
    run of plain decoding (no drafter) on the same prompts, before or after it by turns. Reported per
    run: decode tokens/s over the batch (the tokens after each sequence's first, over the time from the
    first token to the finish: what the prefill costs is not in it; median over repeats) and its ratio
    to the plain run beside it (median over repeats), the same ratio end to end (prefill included), mean acceptance
    length, mean drafted width per step, the measured per-slot acceptance at full width, and whether the
    greedy output equals plain decoding's. Writes benchmarks/results/NAME.json and docs/data/NAME.png.
    """
    from blockdraft.engine.engine import sized_engine
    from blockdraft.layers import cpu_kernels as kernels
    from blockdraft.numerics import cpu_model

    rates = ([float(a) for a in args.rates.split(",")] if args.rates
             else [rate_for(float(al)) for al in args.als.split(",")])
    batches = [int(b) for b in args.batches.split(",")]
    if not (kinds := set(args.modes.split(","))) or not kinds <= {"policy", "width"}:
        raise SystemExit(f"--modes {args.modes}: a comma-separated subset of policy,width")
    configs = shaped_configs()
    families = args.families.split(",")
    if unknown := [f for f in families if f not in configs]:
        raise SystemExit(f"--families: {', '.join(unknown)} not among {', '.join(configs)}")
    pruned = {f: draft_ids(configs[f].vocab_size, args.draft_vocab) for f in families}   # checked before any work
    max_len = args.prompt + 4 * args.tokens + 2 * BLOCK + 16     # the policy's warm-up request is 4x longer
    runs: dict[str, dict] = {}                     # "family numerics" -> mode -> engine
    prompts: dict[str, list[list[int]]] = {}
    with torch.inference_mode():
        for family in families:
            cfg = configs[family]
            perm = chained_perm(cfg.vocab_size, pruned[family])
            ids = torch.arange(cfg.vocab_size) if pruned[family] is None else pruned[family]   # prompts' ids
            for numerics in args.numerics.split(","):
                target = chained_target(cfg, numerics, perm)
                drafters = {a: chained_drafter(target, perm, a, pruned[family]) for a in rates}
                for batch in batches:
                    name = f"{family} {numerics} batch {batch}"
                    modes = {"plain": sized_engine(target, None, batch, max_len, frozenset())}
                    for a, drafter in drafters.items():
                        if "policy" in kinds:
                            modes[f"policy a={a}"] = sized_engine(target, drafter, batch, max_len, frozenset())
                        if "width" in kinds:
                            modes[f"width {BLOCK} a={a}"] = sized_engine(target, drafter, batch, max_len,
                                                                         frozenset(), adaptive_speculation=False)
                    prompts[name] = [[ids[torch.randint(0, len(ids), (args.prompt,),   # a batch per repeat
                                                        generator=torch.Generator().manual_seed(100 * r + i))].tolist()
                                      for i in range(batch)] for r in range(args.repeats)]
                    warm = [ids[torch.randint(0, len(ids), (args.prompt,),
                                              generator=torch.Generator().manual_seed(5 + i))].tolist()
                            for i in range(batch)]
                    for mode, eng in modes.items():            # warm-up: kernel plans, the policy's measurements
                        decode_run(eng, warm, 4 * args.tokens if mode.startswith("policy") else args.tokens // 4)
                        print(name, mode, "warm", file=sys.stderr, flush=True)
                    runs[name] = modes
        results = {name: {mode: [] for mode in modes} for name, modes in runs.items()}
        paired = {name: {mode: [] for mode in modes if mode != "plain"} for name, modes in runs.items()}
        for r in range(args.repeats):
            for name, modes in runs.items():
                for i, mode in enumerate(round_order([m for m in modes if m != "plain"], r)):
                    # each mode beside its own plain run, first or second by turns: the machine's drift
                    # between them is seconds, not the whole round's minutes
                    for m in (("plain", mode) if (r + i) % 2 == 0 else (mode, "plain")):
                        run = decode_run(modes[m], prompts[name][r], args.tokens)
                        (paired[name][mode] if m == "plain" else results[name][mode]).append(run)
                results[name]["plain"] += [xs[-1] for xs in paired[name].values()]
                print(r, name, {m: round(v[-1]["tok_s"], 2) for m, v in results[name].items()},
                      file=sys.stderr, flush=True)
    report = {"cpu": cpu_model(), "isa": kernels.best_isa(), "threads": args.threads, "prompt": args.prompt,
              "tokens": args.tokens, "repeats": args.repeats, "block": BLOCK, "numerics": args.numerics,
              "draft_vocab": args.draft_vocab or "whole vocabulary",
              "drafter": "controlled-acceptance drafter: proposes the target's own greedy continuation, "
                         "each slot with probability a", "rates": rates,
              "asked_als": None if args.rates else [float(al) for al in args.als.split(",")], "models": {}}
    for name, modes in results.items():
        plain = statistics.median(x["tok_s"] for x in modes["plain"])
        plain_e2e = statistics.median(x["end_to_end_tok_s"] for x in modes["plain"])
        row = {"plain_tok_s": plain, "plain_end_to_end_tok_s": plain_e2e}
        for mode, xs in modes.items():
            if mode == "plain":
                continue
            beside = paired[name][mode]
            per_repeat = ratios([x["tok_s"] for x in xs], [p["tok_s"] for p in beside])
            als = [a for x in xs for a in x["als"]] or [1]
            row[mode] = {"tok_s": statistics.median(x["tok_s"] for x in xs), "vs_plain": statistics.median(per_repeat),
                         "end_to_end_vs_plain": median_ratio([x["end_to_end_tok_s"] for x in xs],
                                                             [p["end_to_end_tok_s"] for p in beside]),
                         "vs_plain_per_repeat": per_repeat,
                         "mean_al": statistics.fmean(als),
                         **({"slot_acceptance": slot_rates(als)} if mode.startswith("width") else {}),
                         "mean_width": statistics.fmean(x["width"] for x in xs),
                         "equals_plain": all(x["tokens"] == p["tokens"] for x, p in zip(xs, beside))}
        report["models"][name] = row
    write_results(args.name, report)
    print(json.dumps({n: {m: (v if isinstance(v, float) else {k: v[k] for k in ("vs_plain", "mean_al", "mean_width",
                                                                                 "equals_plain")})
                          for m, v in row.items()} for n, row in report["models"].items()}, indent=1))
    plot(report, args.name)


# --- engine --------------------------------------------------------------------------------------

ENGINE_BATCHES = (1, 2, 4, 8, 16)


def engine_flags(ap) -> None:
    add_repeats(ap, 3)
    add_prompts(ap, None, 48)
    add_threads(ap, 2)
    ap.add_argument("--drafters", default="none,dflash,dflash2,dspark")
    ap.add_argument("--out", default="engine", help="results name: benchmarks/results/NAME.json, NAME.png")
    ap.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=True,
                    help="adaptive speculation policy (--no-adaptive: always draft)")


def engine(args) -> None:
    """Batch-engine throughput: AR vs each drafter at batch 1, 2, 4, 8, 16 on the same prompts.

    The tiny shipped fixtures, 16 random prompts; at each batch size every drafter runs side by side in
    each repeat, on a fresh engine. Generated tokens/s (median of repeats) and mean AL per (drafter,
    batch); spec/AR at each batch size and batch-N/batch-1. Writes benchmarks/results/NAME.json and
    NAME.png (`--out`, default engine).
    """
    from blockdraft.engine.engine import EngineConfig, LLMEngine
    from blockdraft.llm import TINY_ASSETS as ASSETS
    from blockdraft.loading import load_drafter, load_target
    from blockdraft.sampling.params import SamplingParams

    prompts = tiny_prompts(16, seed=9)
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    target = load_target(ASSETS / "target-qwen3")
    drafters = {name: None if name == "none" else load_drafter(ASSETS / name, target)
                for name in args.drafters.split(",")}

    def run(name: str, batch: int):
        def once() -> tuple[float, float]:
            cfg = EngineConfig(max_batch=batch, cache_budget_bytes=64 * 2**20, page_size=16,
                               adaptive_speculation=args.adaptive)
            eng = LLMEngine(target, drafters[name], cfg)
            seconds, outs = clock(lambda: eng.generate(prompts, params))
            return sum(len(o.token_ids) for o in outs) / seconds, eng.stats.spec.mean_acceptance_length
        return once

    results: dict = {name: {} for name in drafters}
    for batch in ENGINE_BATCHES:
        for name, per in side_by_side({name: run(name, batch) for name in drafters}, args.repeats).items():
            rates, als = [r for r, _ in per], [a for _, a in per]
            results[name][batch] = {"tokens_per_s": statistics.median(rates), "runs_tokens_per_s": rates,
                                    "mean_al": statistics.median(als)}
            print(f"{name:8s} batch {batch:2d}: {statistics.median(rates):8.1f} tok/s  AL {statistics.median(als):.2f}",
                  flush=True)
    speedups = {name: {"spec_over_ar": {b: r[b]["tokens_per_s"] / results["none"][b]["tokens_per_s"]
                                        for b in ENGINE_BATCHES} if "none" in results and name != "none" else None,
                       "batch_over_batch1": {b: r[b]["tokens_per_s"] / r[1]["tokens_per_s"] for b in ENGINE_BATCHES}}
                for name, r in results.items()}
    report = {"model": "tiny shipped fixtures (Qwen3, 4 layers, hidden 64, vocab 128), fp32, CPU",
              "prompts": len(prompts), "max_new_tokens": args.tokens, "repeats": args.repeats,
              "threads": args.threads, "adaptive_speculation": args.adaptive, "results": results, "ratios": speedups}
    write_results(args.out, report)
    if made := new_figure(figsize=(7, 4)):
        fig, ax = made
        for name, r in results.items():
            ax.plot(ENGINE_BATCHES, [r[b]["tokens_per_s"] for b in ENGINE_BATCHES], marker="o",
                    label=f"{name} (AL {r[1]['mean_al']:.2f})" if name != "none" else "AR")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max batch")
        ax.set_ylabel("generated tokens/s")
        ax.set_title("blockdraft engine throughput (tiny fixtures, CPU)")
        ax.legend()
        save_figure(fig, args.out, RESULTS)
    print(json.dumps(speedups, indent=2))


# --- policy-ab -----------------------------------------------------------------------------------

def policy_ab_flags(ap) -> None:
    add_repeats(ap, 16)
    ap.add_argument("--batch", type=int, default=6, help="prompts per generate call (the first N chat prompts)")
    add_prompts(ap, None, 48)
    ap.add_argument("--quantization", default="none")
    ap.add_argument("--explore-share", type=float, help="the policy's exploration budget (default: the shipped)")
    ap.add_argument("--min-gap", type=int, help="the policy's fewest steps between looks (default: the shipped)")
    add_threads(ap, 1)
    ap.add_argument("--drafters", default="dspark,dflash",
                    help="speculative modes beside AR; NAME-plain: that drafter's engine held at width 0 "
                    "(what a speculative engine costs when it never drafts)")


def policy_ab(args) -> None:
    """Speculation with the width policy against plain decoding, many short rounds side by side.

    Each round runs AR and each of `--drafters` (default DSpark and DFlash; the policy on, its
    exploration budget as given, default the shipped one; `NAME-plain` holds that engine at width 0)
    over the same chat prompts as one `generate` call each, the order alternating between rounds, every
    mode over one copy of the target's weights (`LLM(share_target=...)`). Reports per-round ratios to AR
    (median, min, max) and the ratio of tokens/s pooled over all rounds; writes
    benchmarks/results/policy_ab.json.
    """
    import blockdraft

    names = ["none"] + args.drafters.split(",")
    plain = blockdraft.LLM(drafter=None, max_batch=max(8, args.batch), quantization=args.quantization)
    # every mode over plain decoding's target tensors (copies of the same weights decode a few percent apart)
    modes = {name: plain if name == "none" else blockdraft.LLM(drafter=name.removesuffix("-plain"),
                                                               max_batch=max(8, args.batch),
                                                               quantization=args.quantization, share_target=plain)
             for name in names}
    for name, llm in modes.items():
        if name.endswith("-plain"):
            llm.engine.policy.choose = lambda batch: 0
        if args.explore_share is not None:
            llm.engine.policy.explore_share = args.explore_share
        if args.min_gap is not None:
            llm.engine.policy.min_gap = args.min_gap
    prompts, _ = chat_prompts(modes["none"].tokenizer, args.batch)
    params = blockdraft.SamplingParams(max_tokens=args.tokens)

    def run(llm) -> tuple[float, int]:
        seconds, outs = clock(lambda: llm.generate(prompt_token_ids=prompts, sampling_params=params))
        return seconds, sum(len(o.token_ids) for o in outs)

    def rate(x: tuple[float, int]) -> float:
        return x[1] / x[0]

    runs = side_by_side({m: lambda llm=llm: run(llm) for m, llm in modes.items()}, args.repeats,
                        lambda r, last: print(r, {m: round(rate(x) / rate(last["none"]), 3) for m, x in last.items()},
                                              file=sys.stderr, flush=True))
    per_round = {m: ratios([rate(x) for x in v], [rate(x) for x in runs["none"]]) for m, v in runs.items()}
    pooled = {m: sum(t for _, t in v) / sum(s for s, _ in v) for m, v in runs.items()}
    report = {"batch": args.batch, "tokens": args.tokens, "rounds": args.repeats, "quantization": args.quantization,
              "threads": args.threads, "explore_share": modes[names[1]].engine.policy.explore_share,
              "min_gap": modes[names[1]].engine.policy.min_gap,
              "vs_ar": {m: {"median": statistics.median(v), "min": min(v), "max": max(v), "rounds": v,
                            "pooled": pooled[m] / pooled["none"]} for m, v in per_round.items() if m != "none"}}
    write_results("policy_ab", report)
    print(json.dumps({m: {k: round(v[k], 3) for k in ("median", "min", "max", "pooled")}
                      for m, v in report["vs_ar"].items()}, indent=1))


# --- widths --------------------------------------------------------------------------------------

def widths_flags(ap) -> None:
    add_prompts(ap, 6, 64)
    add_repeats(ap, 3)
    ap.add_argument("--widths", default="1,2,3,4,8", help="drafting widths, each held by its own engine")
    ap.add_argument("--drafter", default="dspark")
    ap.add_argument("--quantization", default="int4")
    add_threads(ap, 1)


def timed(parts: dict[str, list[float]], name: str, method):
    """`method`, adding each call's seconds to parts[name]."""
    def run(*a, **k):
        t0 = time.perf_counter()
        out = method(*a, **k)
        parts.setdefault(name, []).append(time.perf_counter() - t0)
        return out
    return run


def widths(args) -> None:
    """What a decoding step costs on the default model at each drafting width, and what it buys.

    One engine per width (`num_speculative_tokens`, the width policy off) and one plain engine, all over
    one loaded target, the shipped `--drafter` in the target's numerics; every engine decodes the first
    `--prompts` chat prompts (one at a time, `--tokens` each, EOS ignored), in an order alternating by
    round. Each step's time is split as the engine's runner spends it: the drafter's context writes
    (`flush_context`), its block pass and token choice (`_propose`), and the rest — the target's verify
    pass over 1 + width rows, acceptance and bookkeeping. Reported per width (median round): ms per
    token, per step and per part, each part against a plain step, mean acceptance length, speed against
    plain decoding, and the first-slot acceptance at which drafting one token would break even
    (step cost over a plain step's, minus one). Writes benchmarks/results/widths.json.
    """
    from blockdraft.default_model import smollm2_dir
    from blockdraft.engine.engine import sized_engine
    from blockdraft.llm import resolve_drafter_dir
    from blockdraft.loading import load_drafter, load_target
    from blockdraft.numerics import cpu_model
    from blockdraft.sampling.params import SamplingParams
    from blockdraft.tokenizer import Tokenizer

    held = [int(w) for w in args.widths.split(",")]
    target = load_target(smollm2_dir(), "bfloat16", args.quantization)
    drafter = load_drafter(resolve_drafter_dir(None, args.drafter), target)
    prompts, _ = chat_prompts(Tokenizer(smollm2_dir()), args.prompts)
    max_len = max(len(p) for p in prompts) + args.tokens + 2 * drafter.config.block_size
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    parts: dict[str, dict[str, list[float]]] = {}
    engines = {}
    for name, width in (("plain", None), *((f"width {w}", w) for w in held)):
        eng = engines[name] = sized_engine(target, None if width is None else drafter, 1, max_len, frozenset(),
                                           adaptive_speculation=False, num_speculative_tokens=width)
        runner, parts[name] = eng.runner, {}
        for method in ("decode", "_propose", "flush_context"):
            setattr(runner, method, timed(parts[name], method, getattr(runner, method)))
        eng.generate(prompts[:1], params)                                   # warm: kernel plans
    rounds: dict[str, list[dict]] = {name: [] for name in engines}
    for r in range(args.repeats):
        for name in round_order(engines, r):
            parts[name].clear()
            outs = engines[name].generate(prompts, params)
            steps = len(parts[name]["decode"])
            als = [a for o in outs for a in o.acceptance_lengths] or [1]
            per_step = {k: 1e3 * sum(v) / steps for k, v in parts[name].items()}
            rounds[name].append({"ms_per_token": 1e3 * sum(parts[name]["decode"]) / sum(len(o.token_ids) - 1
                                                                                        for o in outs),
                                 "step_ms": per_step["decode"], "mean_al": statistics.fmean(als),
                                 "drafter_pass_ms": per_step.get("_propose", 0.0),
                                 "context_ms": per_step.get("flush_context", 0.0),
                                 "tokens": [o.token_ids for o in outs]})
        print(r, {m: round(v[-1]["ms_per_token"], 3) for m, v in rounds.items()}, file=sys.stderr, flush=True)
    plain = statistics.median(x["step_ms"] for x in rounds["plain"])
    plain_token = statistics.median(x["ms_per_token"] for x in rounds["plain"])
    report = {"cpu": cpu_model(), "threads": args.threads, "quantization": args.quantization, "drafter": args.drafter,
              "prompts": len(prompts), "tokens": args.tokens, "repeats": args.repeats, "plain_step_ms": plain,
              "widths": {}}
    for name, xs in rounds.items():
        x = sorted(xs, key=lambda run: run["ms_per_token"])[len(xs) // 2]              # the median round
        verify = x["step_ms"] - x["drafter_pass_ms"] - x["context_ms"]
        report["widths"][name] = {
            "ms_per_token": x["ms_per_token"], "vs_plain": plain_token / x["ms_per_token"],
            "mean_al": x["mean_al"], "step_ms": x["step_ms"], "verify_and_rest_ms": verify,
            "drafter_pass_ms": x["drafter_pass_ms"], "context_ms": x["context_ms"],
            "step_vs_plain_step": x["step_ms"] / plain, "verify_vs_plain_step": verify / plain,
            "drafter_pass_vs_plain_step": x["drafter_pass_ms"] / plain, "context_vs_plain_step": x["context_ms"] / plain,
            "break_even_first_slot": x["step_ms"] / plain - 1.0,
            "equals_plain": all(a["tokens"] == b["tokens"] for a, b in zip(xs, rounds["plain"]))}
    write_results("widths", report)
    print(json.dumps({n: {k: round(v, 3) if isinstance(v, float) else v for k, v in w.items()}
                      for n, w in report["widths"].items()}, indent=1))


# --- width-memory --------------------------------------------------------------------------------

def width_memory_flags(ap) -> None:
    add_prompts(ap, 4, 96)
    add_repeats(ap, 2)
    ap.add_argument("--drafter", default="dspark")
    ap.add_argument("--quantization", default="int4")
    add_threads(ap, 1)


def width_memory(args) -> None:
    """One request per new engine, as `blockdraft generate` runs: speculative decoding with a width
    policy that starts from scratch vs one that starts from this machine's remembered measurements,
    against plain decoding of the same numerics, side by side in one run.

    Every prompt runs through plain decoding (one engine, warm), a fresh speculative engine, and a fresh
    speculative engine with `remember_width_costs=True` whose file a first pass over the prompts wrote
    (in a temporary BLOCKDRAFT_CACHE). Only `generate` is timed (not loading). Ratios are taken per
    prompt and repeat; the report keeps medians. Writes benchmarks/results/width_memory.json and
    docs/data/width_memory.png.
    """
    import os

    import blockdraft
    from blockdraft.default_model import smollm2_dir

    model_dir = smollm2_dir()                         # converted once, in the usual cache
    plain = blockdraft.LLM(drafter="none", quantization=args.quantization, max_batch=1)
    params = blockdraft.SamplingParams(max_tokens=args.tokens)
    prompts, _ = chat_prompts(plain.tokenizer, args.prompts)

    def speculative(remember: bool):
        return blockdraft.LLM(drafter=args.drafter, quantization=args.quantization, max_batch=1,
                              remember_width_costs=remember)

    def rate(llm, prompt) -> float:
        seconds, outs = clock(lambda: llm.generate(prompt_token_ids=[prompt], sampling_params=params))
        return len(outs[0].token_ids) / seconds

    with tempfile.TemporaryDirectory() as width_cache:
        os.environ["BLOCKDRAFT_CACHE"] = width_cache   # the remembered measurements live here only
        try:
            (Path(width_cache) / model_dir.name).symlink_to(model_dir)   # the converted model, not converted again
            first = speculative(True)
            for p in prompts:                          # a first pass writes the machine's measurements
                first.generate(prompt_token_ids=[p], sampling_params=params)
            del first
            rates: dict[str, list[float]] = {"plain": [], "fresh": [], "remembered": []}
            for rep in range(args.repeats):
                for p in prompts:
                    for mode in round_order(rates, rep):
                        llm = plain if mode == "plain" else speculative(mode == "remembered")
                        rates[mode].append(rate(llm, p))
                print(f"repeat {rep}: " + ", ".join(f"{m} {v[-1]:.1f} tok/s" for m, v in rates.items()),
                      file=sys.stderr, flush=True)
        finally:
            os.environ.pop("BLOCKDRAFT_CACHE")
    report = {"drafter": args.drafter, "quantization": args.quantization, "threads": args.threads,
              "prompts": len(prompts), "max_new_tokens": args.tokens, "repeats": args.repeats,
              "tokens_per_s": {m: statistics.median(v) for m, v in rates.items()},
              "vs_plain": {m: median_ratio(v, rates["plain"]) for m, v in rates.items()},
              "raw": rates}
    write_results("width_memory", report)
    print(json.dumps({k: v for k, v in report.items() if k != "raw"}, indent=1))
    if made := new_figure(figsize=(6, 3.5)):
        fig, ax = made
        names = list(rates)
        ax.bar(names, [report["vs_plain"][m] for m in names])
        ax.axhline(0.95, ls="--", c="gray", lw=1)
        ax.set_ylabel("tokens/s vs plain decoding")
        ax.set_title(f"one {args.tokens}-token request per new engine ({args.drafter}, {args.quantization})")
        save_figure(fig, "width_memory")


# --- tp ------------------------------------------------------------------------------------------

def tp_flags(ap) -> None:
    add_prompts(ap, 4, 64)
    add_repeats(ap, 3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tp", type=int, default=3, help="SmolLM2 has 9 heads and 3 KV heads: TP 3 divides them")


def tp_task(tp, payload):
    """One rank of a TP group: rank 0 times the prompts through the engine, the others follow it."""
    from blockdraft.llm import LLM
    from blockdraft.parallel.mirror import follow

    kwargs, prompts, params, repeats = payload
    llm = LLM(**kwargs, tp=tp if tp.world > 1 else None)
    if tp.rank != 0:
        follow(llm.engine)
        return None
    tps, lengths = [], []
    for rep in range(repeats):
        tokens, seconds = 0, 0.0
        for p in prompts:
            s, outs = clock(lambda: llm.generate(prompt_token_ids=[p], sampling_params=params))
            seconds += s
            tokens += len(outs[0].token_ids)
            if rep == 0:
                lengths += outs[0].acceptance_lengths
        tps.append(tokens / seconds)
    if tp.world > 1:
        llm.engine.shutdown()
    return {"tokens_per_s": statistics.median(tps), "repeats": tps,
            "mean_al": sum(lengths) / len(lengths) if lengths else None}


def tp(args) -> None:
    """TP=1 vs TP=N on the default model (SmolLM2-135M, bf16 by default), batch 1, gloo on this CPU.

    SmolLM2 has 9 attention heads and 3 KV heads, so N = 3 is the smallest TP size that divides it.
    Each configuration runs the same prompts (AR and the shipped DSpark) through the engine at batch 1
    in its own process group (rank 0 schedules, the others follow: what `generate --tp` and
    `serve --tp` run); tokens/s are medians of repeats, AL from the first repeat. Writes
    benchmarks/results/tp.json.
    """
    from blockdraft.default_model import smollm2_dir
    from blockdraft.llm import DEFAULT_DRAFTERS
    from blockdraft.parallel.launch import run_tp
    from blockdraft.sampling.params import SamplingParams
    from blockdraft.tokenizer import Tokenizer

    target_dir = smollm2_dir()
    prompts, _ = chat_prompts(Tokenizer(target_dir), args.prompts)
    params = SamplingParams(max_tokens=args.tokens)
    report = {"dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.tokens, "results": {}}
    for name, drafter in (("ar", None), ("dspark", DEFAULT_DRAFTERS["dspark"])):
        for size in (1, args.tp):
            kwargs = dict(target=target_dir, drafter=drafter or "none", dtype=args.dtype, max_batch=1,
                          adaptive_speculation=False, quantization="none")
            report["results"][f"{name}_tp{size}"] = run_tp(size, tp_task, (kwargs, prompts, params, args.repeats))
            print(name, size, report["results"][f"{name}_tp{size}"])
    write_results("tp", report)


COMMANDS = {"controlled": (controlled_flags, controlled), "engine": (engine_flags, engine),
            "policy-ab": (policy_ab_flags, policy_ab), "widths": (widths_flags, widths),
            "width-memory": (width_memory_flags, width_memory),
            "tp": (tp_flags, tp)}

if __name__ == "__main__":
    sys.exit(run_commands(__doc__, COMMANDS))
