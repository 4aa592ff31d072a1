"""`blockdraft generate`: one prompt, with torch (optionally tensor-parallel) or an exported ONNX directory."""

from __future__ import annotations

import argparse
import sys

from .args import (HelpFormatter, id_list, llm_kwargs, model_args, print_generation, sampling_params,
                   tp_probe)


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate from one prompt (speculative when a drafter is given)",
                       formatter_class=HelpFormatter,
                       description="Generate from one prompt. Without --target the shipped default model is used; "
                       "--drafter then names a shipped drafter (dflash, dspark, none).")
    model_args(g)
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks: starts N local worker processes "
                   "(or joins a torchrun group); gloo on CPU, NCCL on GPU")
    g.add_argument("--onnx", metavar="EXPORT_DIR", help="run an `export onnx` directory with onnxruntime "
                   "instead of torch (target and drafter come from it)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw prompt text")
    src.add_argument("--prompt-ids", type=id_list, help="comma-separated prompt token ids")
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
    g.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import RequestError
    from ..llm import LLM

    if args.chat and args.prompt is None:
        raise RequestError("--chat needs --prompt (text), not --prompt-ids")
    if args.onnx:
        return _generate_onnx(args)
    if args.tp != 1:
        return _generate_tp(args)
    llm = LLM(**llm_kwargs(args, block_size=args.block_size, confidence_threshold=args.confidence_threshold),
              remember_width_costs=True)
    params = sampling_params(args)
    prompt_ids = llm.encode(args.prompt, args.chat) if args.prompt is not None else args.prompt_ids
    if not args.json and llm.tokenizer is not None:
        return _stream_to_terminal(llm, prompt_ids, params)
    out = llm.generate(prompt_token_ids=[prompt_ids], sampling_params=params)[0]
    print_generation(args, out, out.text, None if llm.drafter is None else llm.drafter.config.kind,
                      {"numerics": llm.numerics, "target": _target_report(llm)})
    return 0


def _target_report(llm) -> dict:
    """What `--json` says of the target: its architecture, the checkpoint tensors it does not run, and
    whether prefix-cache hits are served (and why not)."""
    return {"architecture": llm.target.config.architecture,
            "skipped_tensors": llm.models.skipped_tensors,
            "prefix_caching": getattr(llm.engine, "prefix_caching_off", None) or "on"}


def _generate_tp(args: argparse.Namespace) -> int:
    """`generate --tp N`: validate in this process, then N ranks run the engine; rank 0 answers."""
    from ..engine.admission import check_request
    from ..parallel.launch import run_tp
    from .tp import GenerateJob, generate_task

    kwargs = llm_kwargs(args, block_size=args.block_size, confidence_threshold=args.confidence_threshold,
                         max_batch=1, quantization="none")
    llm = tp_probe(args, kwargs)
    params = sampling_params(args)
    prompt_ids = llm.encode(args.prompt, args.chat) if args.prompt is not None else args.prompt_ids
    check_request(llm.target.config, prompt_ids, params)
    kind, numerics = None if llm.drafter is None else llm.drafter.config.kind, llm.numerics
    del llm
    result = run_tp(args.tp, generate_task, GenerateJob(kwargs, (tuple(prompt_ids),), params))
    if result is None:                       # a non-zero torchrun rank
        return 0
    out = result["generations"][0]
    print_generation(args, out, out.text, kind, {"tp": args.tp, "numerics": numerics})
    return 0


def _generate_onnx(args: argparse.Namespace) -> int:
    """`generate --onnx DIR`: the engine's step with the exported graphs on onnxruntime."""
    from pathlib import Path

    from ..engine.onnx_runner import onnx_engine
    from ..errors import RequestError
    from ..tokenizer import TextStream, Tokenizer

    for flag in ("target", "drafter", "mode", "block_size"):
        if getattr(args, flag) is not None:
            raise RequestError(f"--onnx runs the exported graphs; --{flag.replace('_', '-')} does not apply")
    if args.quantization not in ("none", "auto"):
        raise RequestError("--onnx runs the exported graphs in their own numerics; --quantization does not apply")
    folder = Path(args.onnx)
    tok = Tokenizer(folder) if (folder / "tokenizer.json").is_file() else None
    if args.prompt is not None and tok is None:
        raise RequestError(f"{folder} has no tokenizer.json; pass --prompt-ids")
    params = sampling_params(args)
    prompt = tok.encode_prompt(args.prompt, args.chat) if args.prompt is not None else args.prompt_ids
    decode = tok.decode if tok is not None else None
    eos = frozenset({tok.eos_token_id}) if tok is not None and tok.eos_token_id is not None else frozenset()
    engine = onnx_engine(folder, 1, eos, decode, args.adaptive_speculation, args.num_speculative_tokens)
    out = engine.generate([prompt], params)[0]             # admission checks the request first
    print_generation(args, out, TextStream(decode, params.stop).text(out.token_ids), engine.models.kind,
                      {"backend": "onnxruntime"})
    return 0


def _stream_to_terminal(llm, prompt_ids: list[int], params) -> int:
    """Print text as the engine commits it, then one summary line on stderr."""
    import time

    from ..tokenizer import TextStream

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
