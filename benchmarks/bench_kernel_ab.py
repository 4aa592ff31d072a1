"""Two builds of the CPU kernels side by side in one process: the int4 SmolLM2 target's step time per row
count with `layers/cpu_kernels.c` as it is and as it was at another commit, paired by round.

    python benchmarks/bench_kernel_ab.py --base REV [--rows 1,9] [--rounds 16] [--threads 1] [--context 300]

Both builds run the same Python, weights and cache; each round times every row count with each build (in
alternating order), a mean over several steps each, and the ratio is taken within the round (this machine
drifts by 10-20% over minutes; a whole-process A/B cannot see a 5% change). The two builds' C must take the
same `bd_layers` arguments. Writes benchmarks/results/kernel_ab.json.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from results_io import ROOT, write_results

SOURCE = "src/blockdraft/layers/cpu_kernels.c"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit whose kernels are compared")
    ap.add_argument("--rows", default="1,9")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows_list = [int(r) for r in args.rows.split(",")]

    from blockdraft.default_model import smollm2_dir
    from blockdraft.layers import cpu_kernels
    from blockdraft.loading import load_target

    with tempfile.TemporaryDirectory() as tmp:
        base_source = Path(tmp) / "cpu_kernels.c"
        base_source.write_text(subprocess.run(["git", "show", f"{args.base}:{SOURCE}"], cwd=ROOT, check=True,
                                              capture_output=True, text=True).stdout)
        libs = {}
        for name, source in (("base", base_source), ("head", ROOT / SOURCE)):
            cpu_kernels.SOURCE = source
            cpu_kernels.library.cache_clear()
            libs[name] = cpu_kernels.library()
            if libs[name] is None:
                sys.exit(f"the {name} kernels do not build here")
    chosen = [libs["head"]]
    cpu_kernels.library = lambda: chosen[0]

    target = load_target(smollm2_dir(), "bfloat16", "int4")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.config.vocab_size, (1, args.context), generator=g)
    ms: dict[str, dict[int, list[float]]] = {n: {r: [] for r in rows_list} for n in libs}
    with torch.inference_mode():
        cache = target.new_cache(1, args.context + max(rows_list))
        target(prompt, cache)
        for rnd in range(args.rounds):
            for name in ("base", "head") if rnd % 2 == 0 else ("head", "base"):
                chosen[0] = libs[name]
                for rows in rows_list:
                    ids = torch.randint(0, target.config.vocab_size, (1, rows), generator=g)
                    steps = max(4, 40 // rows)
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        cache.truncate(args.context)
                        target(ids, cache)
                    ms[name][rows].append((time.perf_counter() - t0) / steps * 1e3)
    report = {"base": args.base, "threads": args.threads, "context": args.context, "rounds": args.rounds,
              "ms": ms, "rows": {}}
    for rows in rows_list:
        ratios = [h / b for h, b in zip(ms["head"][rows], ms["base"][rows])]
        report["rows"][rows] = {"base_ms": statistics.median(ms["base"][rows]),
                                "head_ms": statistics.median(ms["head"][rows]),
                                "head_over_base": statistics.median(ratios), "range": [min(ratios), max(ratios)]}
        r = report["rows"][rows]
        print(f"{rows:2d} rows: base {r['base_ms']:6.2f} ms, head {r['head_ms']:6.2f} ms, head/base per round: "
              f"median {r['head_over_base']:.3f} ({r['range'][0]:.3f}-{r['range'][1]:.3f})")
    write_results("kernel_ab", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
