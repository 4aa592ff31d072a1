"""`blockdraft export onnx`: target and drafter as an ONNX Runtime GenAI model directory."""

from __future__ import annotations

import argparse
import json

from .args import HelpFormatter


def add_parser(sub) -> None:
    e = sub.add_parser("export", help="export target + drafter for another runtime",
                       formatter_class=HelpFormatter,
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
    e.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..llm import resolve_drafter_dir, target_dir_of

    try:
        from ..export.onnx_export import export_onnx
        import onnx  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"export onnx needs the onnx extra ({e.name} is missing): pip install 'blockdraft[onnx]'")
    out = export_onnx(target_dir_of(args.target), resolve_drafter_dir(args.target, args.drafter), args.out,
                      args.dtype, args.top_k, page_size=args.page_size, max_batch_size=args.max_batch_size,
                      kv_tokens=args.kv_tokens)
    print(json.dumps({"out": str(out), "files": sorted(p.name for p in out.iterdir())}))
    return 0
