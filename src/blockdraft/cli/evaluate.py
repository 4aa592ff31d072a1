"""`blockdraft eval`: one prompt set with and without the drafter (accuracy, McNemar p, AL, gates)."""

from __future__ import annotations

import argparse
import json
import sys

from ..default_model import DEFAULT_DRAFTER
from ..drafters import registry as drafter_kinds
from .args import HelpFormatter, device_arg, quantization_arg, threads_arg, use_threads


def add_parser(sub) -> None:
    v = sub.add_parser("eval", help="a prompt set with and without the drafter: accuracy, McNemar p, AL, gates",
                       formatter_class=HelpFormatter,
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
    quantization_arg(v)
    device_arg(v)
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
    threads_arg(v)
    v.add_argument("--json", action="store_true", help="print the report as one JSON object")
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..evaluation.evaluate import evaluate
    from ..evaluation.run import EvalConfig, table

    use_threads(args)
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
