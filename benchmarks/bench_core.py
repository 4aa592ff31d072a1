"""Core-loop benchmark: blockdraft's engine vs the reference `dflash_generate`, our AR vs transformers.

Same weights (the shipped tiny checkpoints), same prompts, greedy, one request at a time
through `LLMEngine` (what `generate`, `serve` and `LLM` run; every step drafts the full
block, as the reference loop does); wall-clock medians over repeats, reported as ratios
measured side by side in one run.
Writes benchmarks/results/core.json and core.png.

    python benchmarks/bench_core.py [--repeats 5] [--ref-python PATH_TO_DFLASH_VENV_PYTHON]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from blockdraft.engine.engine import sized_engine
from blockdraft.llm import TINY_ASSETS as ASSETS
from blockdraft.loading import load_drafter, load_target
from blockdraft.sampling.params import SamplingParams

OUT = Path(__file__).parent / "results"


def timed(fn, repeats: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return times, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of every mode")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--ref-python", default=os.environ.get(
        "BLOCKDRAFT_DFLASH_PYTHON", str(Path.home() / ".cache/blockdraft/ref-venvs/dflash/bin/python")),
        help="python of a venv with the z-lab dflash package (the reference loop; skipped when absent)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 124, (int(n),), generator=g).tolist() for n in torch.randint(8, 40, (8,), generator=g)]
    params = SamplingParams(max_tokens=args.max_new_tokens, ignore_eos=True)
    target = load_target(ASSETS / "target-qwen3")
    report: dict = {"model": "tiny shipped fixtures (Qwen3, 4 layers, hidden 64, vocab 128), fp32, CPU",
                    "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                    "threads": args.threads, "runs": {}}

    max_len = max(len(p) for p in prompts) + args.max_new_tokens + 1

    def run(drafter=None):
        """Every repeat a fresh engine (no prefix-cache hits from the last one), prompts one at a time."""
        times, outs = [], None
        for _ in range(args.repeats):
            engine = sized_engine(target, drafter, 1, max_len, frozenset(), adaptive_speculation=False)
            t0 = time.perf_counter()
            outs = [engine.generate([p], params)[0] for p in prompts]
            times.append(time.perf_counter() - t0)
        return times, outs

    ar_times, ar_out = run()
    report["runs"]["ours_ar"] = {"times_s": ar_times, "median_s": statistics.median(ar_times)}

    from transformers import AutoModelForCausalLM  # test/bench-only dependency
    hf = AutoModelForCausalLM.from_pretrained(ASSETS / "target-qwen3", dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # like ignore_eos: EOS is an ordinary token, never suppressed

    def run_hf():
        with torch.no_grad():
            return [hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                max_new_tokens=args.max_new_tokens,
                                do_sample=False, pad_token_id=0)[0, len(p):].tolist() for p in prompts]

    hf_times, hf_out = timed(run_hf, args.repeats)
    assert hf_out == [o.token_ids for o in ar_out], "transformers and blockdraft greedy outputs differ"
    report["runs"]["transformers_generate"] = {"times_s": hf_times, "median_s": statistics.median(hf_times)}

    names = ["dflash", "dflash2", "dspark"]
    for name in names:
        drafter = load_drafter(ASSETS / name, target)
        times, outs = run(drafter)
        assert [o.token_ids for o in outs] == [o.token_ids for o in ar_out], f"{name} is not lossless"
        lengths = [o.acceptance_lengths for o in outs]
        flat = [a for al in lengths for a in al]
        report["runs"][f"ours_{name}"] = {"times_s": times, "median_s": statistics.median(times),
                                          "mean_al": sum(flat) / len(flat), "acceptance_lengths": lengths}

    ref = None
    if Path(args.ref_python).is_file():
        job = {"assets": str(ASSETS), "drafters": ["dflash", "dflash2"], "prompts": prompts,
               "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "threads": args.threads}
        proc = subprocess.run([args.ref_python, str(Path(__file__).parent / "ref_dflash_loop.py")],
                              input=json.dumps(job), capture_output=True, text=True, check=True)
        ref = json.loads(proc.stdout.strip().splitlines()[-1])
        for name, r in ref.items():
            ours = report["runs"][f"ours_{name}"]
            report["runs"][f"reference_{name}"] = {"times_s": r["times_s"], "median_s": statistics.median(r["times_s"]),
                                                   "identical_acceptance_lengths":
                                                   r["acceptance_lengths"] == ours["acceptance_lengths"]}
    else:
        report["reference_skipped"] = f"no dflash reference python at {args.ref_python}"

    med = {k: v["median_s"] for k, v in report["runs"].items()}
    ratios = {"ours_ar_speedup_vs_transformers_generate": med["transformers_generate"] / med["ours_ar"]}
    for name in names:
        ratios[f"ours_{name}_speedup_vs_ours_ar"] = med["ours_ar"] / med[f"ours_{name}"]
        if f"reference_{name}" in med:
            ratios[f"ours_{name}_speedup_vs_reference_loop"] = med[f"reference_{name}"] / med[f"ours_{name}"]
    report["ratios"] = ratios
    for run_ in report["runs"].values():
        run_.pop("acceptance_lengths", None)
    OUT.mkdir(exist_ok=True)
    (OUT / "core.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, OUT / "core.png")
    print(json.dumps({"ratios": ratios, "medians_s": med}, indent=2))


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    names = list(runs)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(names, [runs[n]["median_s"] for n in names], color=["#777" if "ours" not in n else "#2a7" for n in names])
    for i, n in enumerate(names):
        al = runs[n].get("mean_al")
        if al:
            ax.text(i, runs[n]["median_s"], f"AL {al:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"median wall-clock, {report['prompts']} prompts x {report['max_new_tokens']} tokens (s)")
    ax.set_title("blockdraft core loop vs references (tiny fixtures, CPU)")
    plt.xticks(rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
