"""onnxruntime vs torch backend on the default model (SmolLM2-135M + the shipped DSpark), batch 1.

Exports fp32 and bf16 (bf16 initializers, fp32 compute), then per prompt, side by side:
the torch lattice backend, ORT fp32, ORT bf16 — tokens/s (medians of repeats) and mean AL;
bf16 vs fp32 agreement: top-1 lattice candidate match rate over the fp32 run's draft calls
(the bf16 backend replays the same committed context) and the AL difference.
Writes benchmarks/results/onnx.json and onnx.png.

    python benchmarks/bench_onnx.py [--prompts 6] [--tokens 96] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from blockdraft.bench.prompt_sets import load_set
from blockdraft.default_model import smollm2_dir
from blockdraft.export.onnx_export import export_onnx
from blockdraft.export.runtime import OnnxBackend
from blockdraft.lattice_decode import TorchLatticeBackend, lattice_generate
from blockdraft.llm import DEFAULT_DRAFTERS
from blockdraft.loading import load_drafter, load_target
from blockdraft.sampling.params import SamplingParams
from blockdraft.sampling.stops import StopCriteria
from blockdraft.tokenizer import Tokenizer

OUT = Path(__file__).parent / "results"


class Recording:
    """Wraps a backend and records each draft call's inputs and top-1 candidates."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def draft(self, new_taps, new_start, block_ids):
        lattice = self.backend.draft(new_taps, new_start, block_ids)
        self.calls.append((new_taps.clone(), new_start, list(block_ids), lattice.candidate_ids[0, :, 0].clone()))
        return lattice


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    target_dir, drafter_dir = smollm2_dir(), DEFAULT_DRAFTERS["dspark"]
    exports = {}
    for dtype in ("fp32", "bf16"):
        t0 = time.perf_counter()
        exports[dtype] = export_onnx(target_dir, drafter_dir, OUT / f"onnx-export-{dtype}", dtype)
        print(f"export {dtype}: {time.perf_counter() - t0:.1f}s")
    target = load_target(target_dir, "float32")
    backends = {"torch": TorchLatticeBackend(target, load_drafter(drafter_dir, target)),
                "ort_fp32": OnnxBackend(exports["fp32"], threads=2), "ort_bf16": OnnxBackend(exports["bf16"], threads=2)}
    tok = Tokenizer(target_dir)
    stop = StopCriteria(eos_ids=frozenset({tok.eos_token_id}))
    prompts = [tok.encode_chat([{"role": "user", "content": p}])
               for s in ("chat", "math", "humaneval") for p in load_set(s, args.prompts // 3)]
    params = SamplingParams(max_tokens=args.tokens)
    tps = {m: [] for m in backends}
    lengths = {m: [] for m in backends}
    same_tokens = {m: 0 for m in backends}
    top1_match = top1_total = 0
    for rep in range(args.repeats):
        seconds, counts = dict.fromkeys(backends, 0.0), dict.fromkeys(backends, 0)
        for prompt in prompts:
            ref = None
            for name, backend in backends.items():
                rec = Recording(backend) if rep == 0 and name == "ort_fp32" else backend
                t0 = time.perf_counter()
                gen = lattice_generate(rec, prompt, params, stop)
                seconds[name] += time.perf_counter() - t0
                counts[name] += len(gen.token_ids)
                if rep == 0:
                    lengths[name] += gen.acceptance_lengths
                    ref = gen.token_ids if name == "torch" else ref
                    same_tokens[name] += int(gen.token_ids == ref)
                if rep == 0 and name == "ort_fp32":      # replay fp32's draft calls through bf16
                    bf16 = backends["ort_bf16"]
                    bf16.reset()
                    for taps, start, block, top1 in rec.calls:
                        if start < bf16.d_length:         # the fp32 run rewound: restart the context
                            bf16.reset()
                            continue
                        got = bf16.draft(taps, start, block).candidate_ids[0, :, 0]
                        top1_match += int((got == top1).sum())
                        top1_total += got.numel()
        for m in backends:
            tps[m].append(counts[m] / seconds[m])
    report = {"prompts": len(prompts), "max_new_tokens": args.tokens, "repeats": args.repeats,
              "tokens_per_s": {m: statistics.median(v) for m, v in tps.items()}, "tokens_per_s_repeats": tps,
              "mean_al": {m: sum(v) / len(v) for m, v in lengths.items()},
              "greedy_tokens_equal_torch": same_tokens,
              "bf16_top1_match_rate": top1_match / max(1, top1_total), "bf16_top1_compared": top1_total,
              "speedup_vs_torch": {m: statistics.median(a / b for a, b in zip(tps[m], tps["torch"])) for m in tps}}
    OUT.mkdir(exist_ok=True)
    (OUT / "onnx.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "tokens_per_s_repeats"}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    names = list(backends)
    ax.bar(names, [report["tokens_per_s"][m] for m in names])
    for i, m in enumerate(names):
        ax.text(i, report["tokens_per_s"][m], f"AL {report['mean_al'][m]:.2f}", ha="center", va="bottom")
    ax.set_ylabel("tokens/s (batch 1, DSpark)")
    fig.tight_layout()
    fig.savefig(OUT / "onnx.png", dpi=110)


if __name__ == "__main__":
    main()
