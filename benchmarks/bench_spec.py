"""Speculative decoding end to end at a controlled acceptance: measured speed against plain decoding,
with the width policy deciding and at the full block, on family-shaped targets.

    python benchmarks/bench_spec.py [--families lfm2,qwen3.5,smollm2] [--als 1.5,2,3,4,5 | --rates 0.5,0.7]
        [--batches 1,4] [--numerics int4] [--repeats 3] [--prompt 300] [--tokens 64] [--threads 2]
        [--name spec]

The drafter is a *controlled-acceptance drafter*: it proposes the target's own greedy continuation
with a set probability per slot. `--als` asks for mean acceptance lengths at the full block
(per-slot rate a with 1 + a + ... + a^(block-1) = AL); `--rates` gives a directly. The measured AL
is reported beside the asked one. `bench_moe_width.py` predicts the policy's width from timed passes
and an assumed acceptance; this runs the engine. Each family-shaped random target
(`shaped_targets.shaped_configs`: LFM2-1.2B and a Qwen3.5 shape, SmolLM2-135M's, the MoE shapes) is given a known
greedy continuation: its LM head scores token σ(t) highest after token t, for a fixed random
permutation σ (the head's row σ(t) is t's embedding direction; the embedding is large against the
layers' random updates, so the last token decides). A 1-layer DSpark drafter (block 8) is built to
know that chain for a share a of the vocabulary: its Markov head's W1[t] · W2[σ(t)] is large for a
"known" t and as large negative for an unknown one (which the drafter's own hidden-state guess, read through
the target's head, cannot outweigh). Slot i of a block is then accepted with probability about aⁱ, as
in `bench_moe_width.py`, and each drafted token really runs through the drafter, the target's verify
pass over the union of the rows' experts, and the rollback.

For each target, batch size and a, in one process and interleaved by repeat (each repeat its own
random prompts, one per sequence of the batch): plain decoding (no drafter), the engine with its width
policy on (`EngineConfig` defaults; one untimed warm-up request first, so the policy has measured its
costs and acceptance, as a running server's has), and the engine held at the full width 8. Reported
per run: decode tokens/s over the batch (the tokens after each sequence's first, over the time from the
first token to the finish: what the prefill costs is not in it; median over repeats) and its ratio to
plain, the same ratio end to end (prefill included), mean acceptance length,
mean drafted width per step, the measured per-slot acceptance at full width, and whether the greedy
output equals plain decoding's. Writes benchmarks/results/NAME.json and docs/data/NAME.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch

from results_io import new_figure, save_figure, write_results
from shaped_targets import shaped, shaped_configs

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


def chained_drafter(target, perm: torch.Tensor, rate: float):
    """A DSpark drafter whose Markov head knows t -> perm[t] for a share `rate` of the tokens t, in its
    target's weight-only scheme as `load_drafter` puts it."""
    from blockdraft.checkpoints.publish import new_drafter
    from blockdraft.layers.quant import quantize_drafter
    n, vocab = target.config.num_layers, target.config.vocab_size
    drafter = new_drafter(target, "dspark", 1, BLOCK, (1, n // 2, n - 2), mask_token_id=0, markov_rank=MARKOV_RANK)
    g = torch.Generator().manual_seed(2)
    codes = torch.randn(vocab, MARKOV_RANK, generator=g)
    codes = codes / codes.norm(dim=-1, keepdim=True)                    # [vocab, rank], unit rows
    unknown = torch.rand(vocab, generator=g) >= rate
    w1 = torch.where(unknown[:, None], -codes, codes)     # an unknown t's bias holds perm[t] at -scale
    w2 = torch.empty_like(codes)
    w2[perm] = codes * MARKOV_SCALE                                     # bias(t)[perm[t]] = scale for a known t
    head = drafter.markov_head
    with torch.no_grad():
        head.markov_w1.weight.copy_(w1)
        head.markov_w2.weight.copy_(w2)
    return quantize_drafter(drafter, getattr(target, "quantization", "none"))


def rate_for(al: float) -> float:
    """The per-slot rate a whose full-block mean acceptance length 1 + a + ... + a^(BLOCK-1) is `al`."""
    if not 1.0 <= al < BLOCK:
        raise SystemExit(f"--als {al}: a mean acceptance length in [1, {BLOCK}) at block {BLOCK}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        lo, hi = (a, hi) if sum(a ** i for i in range(BLOCK)) < al else (lo, a)
    return round((lo + hi) / 2, 4)


def timed(eng, prompts: list[list[int]], tokens: int) -> dict:
    from blockdraft.sampling.params import SamplingParams
    """Decode tokens/s (the tokens after each sequence's first, over the longest first-token-to-finish
    time: the prefill is not in it) and end-to-end tokens/s (prefill included)."""
    t0 = time.perf_counter()
    outs = eng.generate(prompts, SamplingParams(max_tokens=tokens, ignore_eos=True))
    seconds = time.perf_counter() - t0
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
        full = [row[f"width {BLOCK} a={a}"]["mean_al"] for a in rates]
        for kind, style in (("policy", "-o"), (f"width {BLOCK}", "--x")):
            ax.plot(full, [row[f"{kind} a={a}"]["vs_plain"] for a in rates], style, color=f"C{k}",
                    label=f"{model}, {kind}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel(f"mean acceptance length at the full block {BLOCK} (controlled-acceptance drafter)")
    ax.set_ylabel("decode tokens/s vs plain decoding")
    ax.set_title(f"end to end, {report['numerics']}, {report['threads']} thread(s), {report['cpu']} ({report['isa']})",
                 fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="lfm2,qwen3.5,smollm2")
    ap.add_argument("--als", default="1.5,2,3,4,5", help="mean acceptance lengths at the full block")
    ap.add_argument("--rates", default=None, help="per-slot acceptance rates instead of --als")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--numerics", default="int4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="spec", help="results name: benchmarks/results/NAME.json, docs/data/NAME.png")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from blockdraft.engine.engine import sized_engine
    from blockdraft.layers import cpu_kernels as kernels
    from blockdraft.numerics import cpu_model

    rates = ([float(a) for a in args.rates.split(",")] if args.rates
             else [rate_for(float(al)) for al in args.als.split(",")])
    batches = [int(b) for b in args.batches.split(",")]
    configs = shaped_configs()
    max_len = args.prompt + 4 * args.tokens + 2 * BLOCK + 16     # the policy's warm-up request is 4x longer
    runs: dict[str, dict] = {}                     # "family numerics" -> mode -> engine
    prompts: dict[str, list[list[int]]] = {}
    with torch.inference_mode():
        for family in args.families.split(","):
            cfg = configs[family]
            perm = torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(3))
            for numerics in args.numerics.split(","):
                target = chained_target(cfg, numerics, perm)
                drafters = {a: chained_drafter(target, perm, a) for a in rates}
                for batch in batches:
                    name = f"{family} {numerics} batch {batch}"
                    modes = {"plain": sized_engine(target, None, batch, max_len, frozenset())}
                    for a, drafter in drafters.items():
                        modes[f"policy a={a}"] = sized_engine(target, drafter, batch, max_len, frozenset())
                        modes[f"width {BLOCK} a={a}"] = sized_engine(target, drafter, batch, max_len, frozenset(),
                                                                     adaptive_speculation=False)
                    prompts[name] = [[torch.randint(0, cfg.vocab_size, (args.prompt,),   # a batch per repeat
                                                    generator=torch.Generator().manual_seed(100 * r + i)).tolist()
                                      for i in range(batch)] for r in range(args.repeats)]
                    warm = [torch.randint(0, cfg.vocab_size, (args.prompt,),
                                          generator=torch.Generator().manual_seed(5 + i)).tolist() for i in range(batch)]
                    for mode, eng in modes.items():            # warm-up: kernel plans, the policy's measurements
                        timed(eng, warm, 4 * args.tokens if mode.startswith("policy") else args.tokens // 4)
                        print(name, mode, "warm", file=sys.stderr, flush=True)
                    runs[name] = modes
        results = {name: {mode: [] for mode in modes} for name, modes in runs.items()}
        for r in range(args.repeats):
            for name, modes in runs.items():
                order = list(modes) if r % 2 == 0 else list(modes)[::-1]
                for mode in order:
                    results[name][mode].append(timed(modes[mode], prompts[name][r], args.tokens))
                print(r, name, {m: round(v[-1]["tok_s"], 2) for m, v in results[name].items()},
                      file=sys.stderr, flush=True)
    report = {"cpu": cpu_model(), "isa": kernels.best_isa(), "threads": args.threads, "prompt": args.prompt,
              "tokens": args.tokens, "repeats": args.repeats, "block": BLOCK, "numerics": args.numerics,
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
            speed = statistics.median(x["tok_s"] for x in xs)
            als = [a for x in xs for a in x["als"]] or [1]
            row[mode] = {"tok_s": speed, "vs_plain": speed / plain,
                         "end_to_end_vs_plain": statistics.median(x["end_to_end_tok_s"] for x in xs) / plain_e2e,
                         "vs_plain_per_repeat": [x["tok_s"] / p["tok_s"] for x, p in zip(xs, modes["plain"])],
                         "mean_al": statistics.fmean(als),
                         **({"slot_acceptance": slot_rates(als)} if mode.startswith("width") else {}),
                         "mean_width": statistics.fmean(x["width"] for x in xs),
                         "equals_plain": all(x["tokens"] == p["tokens"] for x, p in zip(xs, modes["plain"]))}
        report["models"][name] = row
    write_results(args.name, report)
    print(json.dumps({n: {m: (v if isinstance(v, float) else {k: v[k] for k in ("vs_plain", "mean_al", "mean_width",
                                                                                 "equals_plain")})
                          for m, v in row.items()} for n, row in report["models"].items()}, indent=1))
    plot(report, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
