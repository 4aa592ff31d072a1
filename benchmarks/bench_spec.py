"""Speculative decoding end to end on MoE-shaped targets: measured speed against plain decoding, the
width policy deciding.

    python benchmarks/bench_moe_spec.py [--families lfm2-moe,gpt-oss,gemma4-moe] [--rates 0.5,0.7,0.85,0.95]
                                        [--numerics int4] [--repeats 3] [--prompt 300] [--tokens 64] [--threads 1]

`bench_moe_width.py` predicts the policy's width from timed passes and an assumed acceptance; this
runs the engine. Each family-shaped random target (`bench_costs.shaped_configs`) is given a known
greedy continuation: its LM head scores token σ(t) highest after token t, for a fixed random
permutation σ (the head's row σ(t) is t's embedding direction; the embedding is large against the
layers' random updates, so the last token decides). A 1-layer DSpark drafter (block 8) is built to
know that chain for a share a of the vocabulary: its Markov head's W1[t] · W2[σ(t)] is large for a
"known" t and as large negative for an unknown one (which the drafter's own hidden-state guess, read through
the target's head, cannot outweigh). Slot i of a block is then accepted with probability about aⁱ, as
in `bench_moe_width.py`, and each drafted token really runs through the drafter, the target's verify
pass over the union of the rows' experts, and the rollback.

For each target and a, in one process and interleaved by repeat (each repeat its own random prompt):
plain decoding (no drafter), the engine with its width policy on (`EngineConfig` defaults; one untimed
warm-up request first, so the policy has measured its costs and acceptance, as a running server's
has), and the engine held at the full width 8. Reported per run: tokens/s (median over repeats) and
its ratio to plain, mean acceptance length, mean drafted width per step, the measured per-slot
acceptance at full width, and whether the greedy output equals plain decoding's.
Writes benchmarks/results/moe_spec.json and docs/moe_spec.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch

from bench_costs import shaped, shaped_configs
from results_io import new_figure, save_figure, write_results

BLOCK = 8
MARKOV_RANK = 128
MARKOV_SCALE = 40.0     # the known chain's bias; the drafter's own logits stay within a few units
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
    return quantize_target(model, "int4") if numerics == "int4" else model


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


def timed(eng, prompt: list[int], tokens: int) -> dict:
    from blockdraft.sampling.params import SamplingParams
    t0 = time.perf_counter()
    out = eng.generate([prompt], SamplingParams(max_tokens=tokens, ignore_eos=True))[0]
    seconds = time.perf_counter() - t0
    steps = max(len(out.acceptance_lengths), 1)
    return {"tok_s": len(out.token_ids) / seconds, "tokens": out.token_ids, "als": out.acceptance_lengths,
            "width": out.drafted / steps}


def slot_rates(als: list[int]) -> list[float]:
    """From full-width steps' acceptance lengths: P(slot i accepted | slots before it were), i = 1..block."""
    reached = [sum(a - 1 >= i for a in als) for i in range(BLOCK + 1)]
    return [reached[i] / reached[i - 1] if reached[i - 1] else float("nan") for i in range(1, BLOCK + 1)]


def plot(report: dict) -> None:
    """docs/moe_spec.png: speed against plain per acceptance rate, the policy and full width per target."""
    if not (made := new_figure(figsize=(7, 3.8))):
        return
    fig, ax = made
    rates = report["rates"]
    for k, (name, row) in enumerate(report["models"].items()):
        for kind, style in (("policy", "-o"), (f"width {BLOCK}", "--x")):
            ax.plot(rates, [row[f"{kind} a={a}"]["vs_plain"] for a in rates], style, color=f"C{k}",
                    label=f"{name}, {kind}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("per-slot acceptance a (drafter's known share)")
    ax.set_ylabel("tokens/s vs plain decoding")
    ax.set_title(f"MoE targets end to end, batch 1, {report['threads']} thread(s), {report['cpu']} ({report['isa']})")
    ax.legend(fontsize=7)
    save_figure(fig, "moe_spec")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="lfm2-moe,gpt-oss,gemma4-moe")
    ap.add_argument("--rates", default="0.5,0.7,0.85,0.95")
    ap.add_argument("--numerics", default="int4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from blockdraft.engine.engine import sized_engine
    from blockdraft.layers import cpu_kernels as kernels
    from blockdraft.numerics import cpu_model

    rates = [float(a) for a in args.rates.split(",")]
    configs = shaped_configs()
    max_len = args.prompt + 4 * args.tokens + 2 * BLOCK + 16     # the policy's warm-up request is 4x longer
    runs: dict[str, dict] = {}                     # "family numerics" -> mode -> engine
    prompts: dict[str, list[list[int]]] = {}
    with torch.inference_mode():
        for family in args.families.split(","):
            cfg = configs[family]
            perm = torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(3))
            for numerics in args.numerics.split(","):
                name = f"{family} {numerics}"
                target = chained_target(cfg, numerics, perm)
                modes = {"plain": sized_engine(target, None, 1, max_len, frozenset())}
                for a in rates:
                    drafter = chained_drafter(target, perm, a)
                    modes[f"policy a={a}"] = sized_engine(target, drafter, 1, max_len, frozenset())
                    modes[f"width {BLOCK} a={a}"] = sized_engine(target, drafter, 1, max_len, frozenset(),
                                                                 adaptive_speculation=False)
                prompts[name] = [torch.randint(0, cfg.vocab_size, (args.prompt,),     # one per repeat
                                               generator=torch.Generator().manual_seed(10 + r)).tolist()
                                 for r in range(args.repeats)]
                warm = torch.randint(0, cfg.vocab_size, (args.prompt,),
                                     generator=torch.Generator().manual_seed(5)).tolist()
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
              "tokens": args.tokens, "repeats": args.repeats, "block": BLOCK, "rates": rates, "models": {}}
    for name, modes in results.items():
        plain = statistics.median(x["tok_s"] for x in modes["plain"])
        row = {"plain_tok_s": plain}
        for mode, xs in modes.items():
            if mode == "plain":
                continue
            speed = statistics.median(x["tok_s"] for x in xs)
            als = [a for x in xs for a in x["als"]] or [1]
            row[mode] = {"tok_s": speed, "vs_plain": speed / plain,
                         "vs_plain_per_repeat": [x["tok_s"] / p["tok_s"] for x, p in zip(xs, modes["plain"])],
                         "mean_al": statistics.fmean(als),
                         **({"slot_acceptance": slot_rates(als)} if mode.startswith("width") else {}),
                         "mean_width": statistics.fmean(x["width"] for x in xs),
                         "equals_plain": all(x["tokens"] == p["tokens"] for x, p in zip(xs, modes["plain"]))}
        report["models"][name] = row
    write_results("moe_spec", report)
    print(json.dumps({n: {m: (v if isinstance(v, float) else {k: v[k] for k in ("vs_plain", "mean_al", "mean_width",
                                                                                 "equals_plain")})
                          for m, v in row.items()} for n, row in report["models"].items()}, indent=1))
    plot(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
