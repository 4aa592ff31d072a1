"""The two ways a hybrid target's DeltaNet state rolls back after a verify, side by side in one process.

`replay` records each verified row's inputs (q, k, v, g, beta) and, after a rejection, reruns the
recurrence over the kept rows from the pre-verify state; `per_row` keeps the state after every verified
row and picks one. Timed: one DeltaNet layer's recurrence over a verify block plus the commit, at
Qwen3.5 geometry (16 value heads of 128 x 128), for a batch of sequences that keep `--keep` rows.

    python benchmarks/bench_state_rollback.py [--rows 9] [--keep 3] [--batch 1,8] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from blockdraft.cache.state import StateLayout, StatePool
from blockdraft.config import DeltaNetConfig
from blockdraft.layers.deltanet import delta_rule
from blockdraft.cache.state import LayerRecord
from blockdraft.numerics import cpu_model


def one(pool: StatePool, batch: int, rows: int, keep: int, cfg: DeltaNetConfig) -> float:
    g = torch.Generator().manual_seed(0)
    h, dk, dv = cfg.num_v_heads, cfg.k_dim, cfg.v_dim
    q = torch.randn(batch, rows, h, dk, generator=g) * 0.05
    k = torch.randn(batch, rows, h, dk, generator=g) * 0.05
    v = torch.randn(batch, rows, h, dv, generator=g)
    gate, beta = -torch.rand(batch, rows, h, generator=g), torch.rand(batch, rows, h, generator=g)
    rows_in = torch.randn(batch, rows, cfg.conv_dim, generator=g).to(torch.bfloat16)
    slots = list(range(batch))
    t0 = time.perf_counter()
    step = pool.begin(slots, [rows] * batch)
    _, final, per_row = delta_rule(step.rec[0], q, k, v, gate, beta, None, step.keep_states)
    step.record(0, LayerRecord(rows_in, q, k, v, gate, beta, final, per_row))
    pool.commit(step, slots, [keep] * batch)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rows", type=int, default=9, help="verified rows (anchor + drafts)")
    ap.add_argument("--keep", type=int, default=3, help="rows each sequence keeps (anchor + accepted)")
    ap.add_argument("--batch", default="1,8", help="batch sizes")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="docs/data/state_rollback.json")
    args = ap.parse_args()
    cfg = DeltaNetConfig(num_k_heads=16, num_v_heads=16, k_dim=128, v_dim=128, conv_kernel=4)
    results = []
    for batch in (int(b) for b in args.batch.split(",")):
        layout = StateLayout({0: (cfg.conv_kernel - 1, cfg.conv_dim)}, cfg, (0,))
        pools = {mode: StatePool(layout, batch, torch.bfloat16, rollback=mode)
                 for mode in ("replay", "per_row")}
        times = {mode: [] for mode in pools}
        for _ in range(args.repeats):              # paired by round, alternating order
            for mode in pools:
                times[mode].append(one(pools[mode], batch, args.rows, args.keep, cfg))
        state_mb = cfg.num_v_heads * cfg.k_dim * cfg.v_dim * 4 / 2**20
        row = {"batch": batch, "rows": args.rows, "keep": args.keep,
               "replay_ms": 1e3 * statistics.median(times["replay"]),
               "per_row_ms": 1e3 * statistics.median(times["per_row"]),
               "replay_extra_mb": batch * state_mb,                       # the working copy
               "per_row_extra_mb": batch * args.rows * state_mb}          # a state per verified row
        results.append(row)
        print(row)
    out = {"what": "one DeltaNet layer (16 heads of 128x128): recurrence over a verify block + commit, medians",
           "cpu": cpu_model(), "threads": torch.get_num_threads(), "results": results}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
