"""Time one SmolLM2 bf16 pass by row count (context 300, one thread): row-invariant attention vs SDPA.

    python scripts/step_cost.py
"""
import torch, time, sys
torch.set_num_threads(1)
from blockdraft.default_model import smollm2_dir
from blockdraft.loading import load_target
import blockdraft.layers.attention as A
t = load_target(smollm2_dir(), "bfloat16")
ids = torch.randint(0, 49152, (1, 300)); c = t.new_cache(1, 400)
with torch.inference_mode():
    t(ids, c)
    def step(rows):
        c.truncate(300); return t(torch.randint(0, 49152, (1, rows)), c)
    for mode in ("stable", "sdpa"):
        if mode == "sdpa":
            A._row_stable = lambda q, k, v, vis, scale, g: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=vis, scale=scale, enable_gqa=g > 1)
        res = {}
        for rows in (1, 2, 4, 9, 17):
            step(rows); ts = []
            for _ in range(7):
                s = time.perf_counter(); step(rows); ts.append(time.perf_counter() - s)
            res[rows] = round(sorted(ts)[3] * 1e3, 1)
        print(mode, "ms per pass by rows (ctx 300):", res)
