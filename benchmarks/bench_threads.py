"""Plain int4 decoding at one thread and at torch's default, against ONNX Runtime GenAI int4 at one
thread and at its default, side by side (the default model, batch 1, greedy).

    python benchmarks/bench_threads.py [--rounds 5] [--prompts 6] [--tokens 48] [--busy]

Each round runs every mode over the same prompts, one after another (machine speed drifts: ratios
are taken per round). Our mode at torch's default thread count is what `blockdraft generate`
runs (it sets no thread count; each step then runs that count or one, whichever measures faster:
`engine/threads.py`); "fixed" holds the default count every step. ORT-GenAI's default is one
intra-op thread per core. `--busy` runs a busy loop in another process throughout (a shared machine
whose other core is taken). Writes `benchmarks/results/threads[_busy].json` and `docs/threads[_busy].png`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from results_io import new_figure, save_figure, write_results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--busy", action="store_true", help="a busy loop in another process throughout")
    args = ap.parse_args()
    default_threads = torch.get_num_threads()

    import blockdraft
    from blockdraft.bench import ortgenai
    from blockdraft.bench.prompt_sets import load_set
    from blockdraft.default_model import cache_root, smollm2_dir
    from blockdraft.numerics import cpu_model

    llm = blockdraft.LLM(drafter="none", max_batch=1, quantization="int4")
    tok = llm.tokenizer
    texts = load_set("chat", args.prompts)
    prompts = [tok.encode_chat([{"role": "user", "content": t}]) for t in texts]
    rendered = [tok.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
    eos = set(llm._eos_ids())
    built = ortgenai.build(smollm2_dir(), "int4", cache_root())
    if built is None:
        sys.exit("ONNX Runtime GenAI's builder is not available (pip install 'blockdraft[onnx]')")
    params = blockdraft.SamplingParams(max_tokens=args.tokens)

    from blockdraft.engine.threads import ThreadChoice

    adaptive = llm.engine.threads

    def ours(threads: int, fixed: bool = False) -> float:
        torch.set_num_threads(threads)
        llm.engine.threads = ThreadChoice(enabled=False) if fixed else adaptive
        n, t0 = 0, time.perf_counter()
        for p in prompts:
            n += len(llm.generate(prompt_token_ids=[p], sampling_params=params)[0].token_ids)
        return n / (time.perf_counter() - t0)

    def ort(threads: int | None) -> float:
        n, seconds = 0, 0.0
        for text in rendered:
            s, outs = ortgenai.generator_generate(built, [text], 1, args.tokens, threads=threads)
            seconds += s
            n += sum(len(ortgenai.until_eos(o, eos)) for o in outs)
        return n / seconds

    modes = {"ours_1_thread": lambda: ours(1),
             f"ours_{default_threads}_threads (default)": lambda: ours(default_threads),
             f"ours_{default_threads}_threads_fixed": lambda: ours(default_threads, fixed=True),
             "ortgenai_1_thread": lambda: ort(1), "ortgenai_default_threads": lambda: ort(None)}
    if args.busy:
        import subprocess

        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    for run in modes.values():          # warm-up: first-use conversions, the int4 build's session
        run()
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode, run in modes.items():
            rates[mode].append(run())
        print(r, {m: round(v[-1], 1) for m, v in rates.items()}, file=sys.stderr, flush=True)
    if args.busy:
        neighbour.kill()
    ours1, ours_d, _, ort1, ort_d = rates.values()
    ratio = {"ours_1_vs_ortgenai_1": [a / b for a, b in zip(ours1, ort1)],
             "ours_default_vs_ortgenai_default": [a / b for a, b in zip(ours_d, ort_d)],
             "ours_best_vs_ortgenai_best": [max(a, c) / max(b, d) for a, c, b, d in zip(ours1, ours_d, ort1, ort_d)]}
    report = {"cpu": cpu_model(), "busy_neighbour": args.busy, "torch_default_threads": default_threads,
              "prompts": len(prompts),
              "max_new_tokens": args.tokens, "rounds": args.rounds,
              "tokens_per_s": {m: {"median": statistics.median(v), "rounds": v} for m, v in rates.items()},
              "ratios": {k: {"median": statistics.median(v), "rounds": v} for k, v in ratio.items()}}
    name = "threads_busy" if args.busy else "threads"
    write_results(name, report)
    print(json.dumps(report, indent=1))
    if made := new_figure(figsize=(8, 3.5)):
        fig, ax = made
        ax.bar(range(len(rates)), [statistics.median(v) for v in rates.values()])
        ax.set_xticks(range(len(rates)), list(rates), fontsize=8, rotation=10)
        ax.set_ylabel("generated tokens/s (median of rounds)")
        ax.set_title(f"SmolLM2-135M int4, batch 1, {len(prompts)} chat prompts x {args.tokens} tokens"
                     + (", other core busy" if args.busy else ""))
        save_figure(fig, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
