"""ONNX Runtime GenAI 0.18.0 as a comparison point: its own builder's CPU models through
`og.Generator`, and any engine-ready directory (ours included) through `og.Engine`, greedy.
Needs the onnx extra (onnxruntime-genai)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """Generated ids cut after the first EOS (og.Generator keeps a batch row going until all stop)."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def build(src: Path, precision: str, cache: Path) -> Path | None:
    """`python -m onnxruntime_genai.models.builder -i SRC -o OUT -p fp32|int4 -e cpu`, once; None if it fails."""
    out = cache / f"ortgenai-smollm2-{precision}"
    if not (out / "genai_config.json").is_file():
        try:
            subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o", str(out),
                            "-p", precision, "-e", "cpu"], check=True, stdout=subprocess.DEVNULL)
        except subprocess.CalledProcessError as e:
            print(f"ORT-GenAI builder failed for {precision}: {e}", file=sys.stderr)
            return None
    return out


def generator_generate(folder: Path, texts: list[str], batch: int, max_new: int,
                       threads: int | None = None) -> tuple[float, list[list[int]]]:
    """Chat-templated texts, `batch` at a time, through og.Generator (its tokenizer pads a batch and the
    generator masks the padding) -> (seconds, generated ids per text). `threads`: onnxruntime's intra-op
    threads (None: its default, one per core)."""
    import json

    import onnxruntime_genai as og

    config = og.Config(str(folder))
    if threads is not None:
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    model = og.Model(config)
    tok = og.Tokenizer(model)
    outs, t0 = [], time.perf_counter()
    for lo in range(0, len(texts), batch):
        group = texts[lo:lo + batch]
        ids = tok.encode_batch(group)                                      # [batch, longest]
        prefix = ids.shape()[1]
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=prefix + max_new, batch_size=len(group))
        gen = og.Generator(model, params)
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
        outs += [[int(t) for t in gen.get_sequence(i)[prefix:]] for i in range(len(group))]
    return time.perf_counter() - t0, outs


def engine_generate(folder: Path, prompts: list[list[int]], max_new: int, batch: int | None = None
                    ) -> tuple[float, list[list[int]], dict]:
    """Prompt ids through og.Engine on the CPU provider, `batch` requests in flight at a time (default:
    all) -> (seconds, generated ids per prompt, `get_speculative_stats()`)."""
    import numpy as np
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    config.clear_providers()                                  # the CPU execution provider
    engine = og.Engine(og.Model(config))
    batch = batch or len(prompts)
    outs, t0 = [], time.perf_counter()
    for lo in range(0, len(prompts), batch):
        requests = []
        for prompt in prompts[lo:lo + batch]:
            request = engine.create_request()
            options = og.TurnOptions(request)
            options.set_max_generated_tokens(max_new)
            options.set_do_sample(False)
            request.begin_turn(np.array(prompt, dtype=np.int32), options)
            requests.append(request)
        tokens = {id(r): [] for r in requests}
        events = engine.create_event_buffer(4096)
        while engine.has_pending_requests():
            for event in engine.run(events):
                if int(event.error_code) != 0:
                    raise RuntimeError(f"og.Engine: {event.error_code}")
                if int(event.flags) & int(og.EngineEventFlags.TOKEN):
                    tokens[id(event.request)].append(int(event.token))
        outs += [tokens[id(r)] for r in requests]
    return time.perf_counter() - t0, outs, engine.get_speculative_stats()
