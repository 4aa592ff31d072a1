"""One export, two runtimes: og.Engine (ONNX Runtime GenAI 0.18.0's own engine) vs blockdraft's
onnxruntime backend on the same `export onnx` directory of the default model (SmolLM2-135M +
the shipped DSpark, fp32), and ORT-GenAI's own CPU builds of the same weights without a drafter.

    python benchmarks/bench_onnx.py [--prompts 4] [--tokens 48] [--repeats 2] [--batches 1,4]

Side by side in one process, every repeat runs every mode over the same chat prompts (greedy):
  og_engine_dspark   og.Engine on the export, drafter on (batch b = b requests in flight at once)
  og_engine_plain    og.Engine on the same graphs with the drafter section removed (plain decoding)
  blockdraft_dspark  blockdraft's engine with onnxruntime behind it on the export (`generate --onnx`),
                     width policy on (what it ships); blockdraft_dspark_full: every step the full block
  ortgenai_fp32/int4 og.Generator on ORT-GenAI's own builder output (`-p fp32|int4 -e cpu`)
tokens/s = generated tokens (to EOS) / wall time, prefill included; medians over repeats; mean AL
from og's `get_speculative_stats()` (accepted / rounds + 1) and from our per-step lengths.
Writes benchmarks/results/onnx.json and docs/data/onnx_engines.png (docs/benchmarks.md cites docs/data/onnx_engines.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from blockdraft.bench import ortgenai
from blockdraft.bench.ortgenai import until_eos
from blockdraft.bench.prompt_sets import load_set
from blockdraft.default_model import cache_root, smollm2_dir
from blockdraft.engine.engine import sized_engine
from blockdraft.export.onnx_export import export_onnx
from blockdraft.engine.onnx_runner import onnx_engine
from blockdraft.llm import DEFAULT_DRAFTERS
from blockdraft.loading import load_target
from blockdraft.numerics import cpu_model
from blockdraft.sampling.params import SamplingParams
from blockdraft.tokenizer import Tokenizer
from results_io import new_figure, save_figure, write_results

CACHE = cache_root()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--prompts", type=int, default=4, help="chat prompts")
    ap.add_argument("--tokens", type=int, default=48, help="tokens generated per prompt at most (to EOS)")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of every mode")
    ap.add_argument("--batches", default="1,4", help="comma-separated requests in flight")
    args = ap.parse_args()
    export = CACHE / "onnx-smollm2-dspark-fp32"
    if not (export / "genai_config.json").is_file():
        export_onnx(smollm2_dir(), DEFAULT_DRAFTERS["dspark"], export, "fp32")
    plain = CACHE / "onnx-smollm2-plain-fp32"                 # the same graphs, no drafter section
    if not (plain / "genai_config.json").is_file():
        shutil.rmtree(plain, ignore_errors=True)
        plain.mkdir(parents=True)
        for f in export.iterdir():
            if not f.name.startswith("dspark.onnx"):
                (plain / f.name).symlink_to(f)
        cfg = json.loads((export / "genai_config.json").read_text())
        cfg["model"].pop("dspark")
        cfg.pop("speculative")
        (plain / "genai_config.json").unlink()
        (plain / "genai_config.json").write_text(json.dumps(cfg, indent=1))
    builds = {f"ortgenai_{p}": ortgenai.build(smollm2_dir(), p, CACHE) for p in ("fp32", "int4")}
    tok = Tokenizer(smollm2_dir())
    eos = {tok.eos_token_id}
    texts = load_set("chat", args.prompts)
    prompts = [tok.encode_chat([{"role": "user", "content": t}]) for t in texts]
    rendered = [tok.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
    params = SamplingParams(max_tokens=args.tokens)

    target = load_target(smollm2_dir(), "float32")            # the export's numerics, plain decoding in our engine
    engine = sized_engine(target, None, len(prompts), max(map(len, prompts)) + args.tokens, frozenset(eos))
    reference = [until_eos(o.token_ids, eos) for o in engine.generate(prompts, params)]
    del target, engine
    batches = [int(b) for b in args.batches.split(",")]
    results = {}
    for batch in batches:
        modes = ["og_engine_dspark", "og_engine_plain", "blockdraft_dspark", "blockdraft_dspark_full",
                 *[m for m, d in builds.items() if d is not None]]
        rate = {m: [] for m in modes}
        info = {m: {} for m in modes}
        for rep in range(args.repeats):
            for mode in modes:
                stats = None
                if mode == "og_engine_dspark":
                    seconds, outs, stats = ortgenai.engine_generate(export, prompts, args.tokens, batch)
                elif mode == "og_engine_plain":
                    seconds, outs, _ = ortgenai.engine_generate(plain, prompts, args.tokens, batch)
                elif mode.startswith("blockdraft_dspark"):
                    engine = onnx_engine(export, batch, frozenset(eos), adaptive_speculation=not mode.endswith("full"))
                    t0 = time.perf_counter()
                    gens = engine.generate(prompts, params)
                    seconds = time.perf_counter() - t0
                    outs = [g.token_ids for g in gens]
                    lengths = [a for g in gens for a in g.acceptance_lengths]
                    info[mode]["mean_al"] = sum(lengths) / len(lengths)
                else:
                    seconds, outs = ortgenai.generator_generate(builds[mode], rendered, batch, args.tokens)
                outs = [until_eos(o, eos) for o in outs]
                rate[mode].append(sum(len(o) for o in outs) / seconds)
                if stats is not None:
                    info[mode]["mean_al"] = stats["draft_tokens_accepted"] / max(1, stats["rounds"]) + 1
                    info[mode]["draft_forward_passes"] = stats["draft_forward_passes"]
                if rep == 0:
                    info[mode]["greedy_equal_to_torch_fp32_ar"] = f"{sum(a == b for a, b in zip(outs, reference))}/{len(outs)}"
                print(f"batch {batch} rep {rep} {mode}: {rate[mode][-1]:.1f} tok/s {info[mode]}", file=sys.stderr,
                      flush=True)
        results[batch] = {m: {"tokens_per_s": statistics.median(v), "repeats": v, **info[m],
                              "vs_og_engine_plain": statistics.median(
                                  a / b for a, b in zip(v, rate["og_engine_plain"]))} for m, v in rate.items()}
    report = {"export": str(export), "prompts": len(prompts), "max_new_tokens": args.tokens, "repeats": args.repeats,
              "results": results, "cpu": cpu_model()}
    write_results("onnx", report)
    print(json.dumps(report, indent=1))
    fig, axes = new_figure(nrows=1, ncols=len(batches), figsize=(5 * len(batches), 3.6), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        names = list(results[batch])
        ax.bar(range(len(names)), [results[batch][m]["tokens_per_s"] for m in names])
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"batch {batch}")
        ax.set_ylabel("tokens/s")
    save_figure(fig, "onnx_engines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
