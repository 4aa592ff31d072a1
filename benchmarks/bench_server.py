"""Serving: 32 concurrent streaming clients on loopback, with and without a drafter.

    python benchmarks/bench_server.py [--clients 32] [--max-tokens 48] [--max-batch 16]

The tiny shipped fixtures behind the OpenAI-compatible server (`server/thread.py`), the official
`openai` client; per drafter (none, dspark, dflash2) one warm-up load, then every client streams one
completion at once. Reports requests/s, p50/p95 time to first token, p50/p95 inter-token latency (per
request: (last token time - first token time) / (tokens - 1)) and mean AL.
Writes benchmarks/results/server.json.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

from harness import add_prompts, add_threads, run_commands, write_results

MODEL, API_KEY = "tiny", "sk-test"     # what the server serves and checks, and the clients send


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def one(client, i: int, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    stamps, tokens, al = [], 0, None
    stream = await client.completions.create(model=MODEL, prompt=f"request {i} says", max_tokens=max_tokens,
                                             temperature=0, stream=True, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            stamps.append(time.perf_counter())
        if chunk.choices and chunk.choices[0].finish_reason:
            extra = chunk.model_extra.get("blockdraft") or {}
            al = extra.get("mean_acceptance_length")
            tokens = sum(extra.get("acceptance_lengths", [])) + 1 if extra.get("acceptance_lengths") else max_tokens
    return {"ttft": stamps[0] - t0, "itl": (stamps[-1] - stamps[0]) / max(1, tokens - 1), "al": al}


async def load(url: str, clients: int, max_tokens: int) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    t0 = time.perf_counter()
    runs = await asyncio.gather(*(one(client, i, max_tokens) for i in range(clients)))
    wall = time.perf_counter() - t0
    await client.close()
    ttft, itl = [r["ttft"] for r in runs], [r["itl"] for r in runs]
    als = [r["al"] for r in runs if r["al"]]
    return {"requests_per_s": clients / wall, "wall_s": wall, "ttft_p50_s": pct(ttft, 0.5),
            "ttft_p95_s": pct(ttft, 0.95), "itl_p50_s": pct(itl, 0.5), "itl_p95_s": pct(itl, 0.95),
            "mean_al": statistics.mean(als) if als else None}


def flags(ap) -> None:
    ap.add_argument("--clients", type=int, default=32, help="concurrent streaming clients")
    add_prompts(ap, None, 48)
    ap.add_argument("--max-batch", type=int, default=16, help="the engine's max batch")
    add_threads(ap, None)


def serve(args) -> None:
    """Every drafter behind the server in turn, loaded by `--clients` streaming clients at once."""
    from blockdraft.llm import LLM, TINY_ASSETS
    from blockdraft.server.thread import ServerThread

    report = {"model": "tiny shipped fixtures, fp32, CPU", "clients": args.clients, "max_tokens": args.tokens,
              "max_batch": args.max_batch, "runs": {}}
    for name in ("none", "dspark", "dflash2"):
        llm = LLM(target=TINY_ASSETS / "target-qwen3", drafter=None if name == "none" else TINY_ASSETS / name,
                  max_batch=args.max_batch, adaptive_speculation=True)
        with ServerThread(llm, MODEL, API_KEY) as srv:
            asyncio.run(load(srv.url, 4, 8))                     # warm-up
            report["runs"][name] = asyncio.run(load(srv.url, args.clients, args.tokens))
        print(name, json.dumps(report["runs"][name]), flush=True)
    write_results("server", report)


if __name__ == "__main__":
    sys.exit(run_commands(__doc__, {}, default=(flags, serve)))
