"""`blockdraft serve`: the OpenAI-compatible HTTP server (one process, or rank 0 of a TP group)."""

from __future__ import annotations

import argparse
import sys

from .args import HelpFormatter, llm_kwargs, model_args, tp_probe


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, /metrics)",
                       formatter_class=HelpFormatter,
                       description="Serve the target (speculatively with --drafter) over an OpenAI-compatible "
                       "API. Needs the serve extra: pip install 'blockdraft[serve]'.")
    model_args(s)
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
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError

    try:
        import uvicorn

        from ..server.app import build_app, startup_line
    except ImportError as e:
        raise ConfigError(f"serve needs the serve extra ({e.name} is missing): pip install 'blockdraft[serve]'")
    from ..llm import LLM

    kwargs = llm_kwargs(args, max_batch=args.max_batch, cache_budget_bytes=args.cache_budget,
                         max_model_len=args.max_model_len)
    if args.tp != 1:
        import signal

        from ..parallel.launch import run_tp
        from .tp import ServeJob, serve_task

        tp_probe(args, {**kwargs, "max_batch": 1, "cache_budget_bytes": None})      # validate, then drop it
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches rank 0, which shuts the group down
        run_tp(args.tp, serve_task, ServeJob(kwargs, args.model_name, args.api_key, args.host, args.port),
               timeout_s=24 * 3600)
        return 0
    llm = LLM(**kwargs, remember_width_costs=True)
    app = build_app(llm, model_name=args.model_name, api_key=args.api_key)
    print(startup_line(llm, args.host, args.port), file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
