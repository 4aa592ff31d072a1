"""`blockdraft bench --sweep`: decode throughput over a context length × batch size matrix, plain
decoding vs speculative decoding side by side in every cell (the seeds' 512–8192 × 1–16 table).
The speculative engine drafts the drafter's full block every step (no width policy), so a cell
shows what the drafter itself buys there.

Each cell prefills `batch` prompts of exactly `context` tokens (slices of one text: HumanEval's
problems, tiled), then decodes `new_tokens` greedy tokens per row with EOS ignored, so both modes
produce the same number of tokens. Decode tokens/s counts only the steps after every row has its
first token, so the prefill (identical in both modes) does not dilute the comparison. Modes run
alternately in each repeat; tokens/s are medians over repeats and the speedup is the median of the
per-repeat ratios, so machine noise hits both sides of each ratio alike. Every cell's KV cache (target and drafter)
is checked against the budget before any cell runs; cells that cannot fit are refused by name.
Contexts past the model's limit are capped at the longest that fits with the decoded tokens.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from ..cache.plan import PAGE_SIZE
from ..engine.engine import default_cache_budget, sized_engine
from ..default_model import DEFAULT_DRAFTER
from ..errors import ConfigError
from ..sampling.params import SamplingParams
from .prompt_sets import humaneval_path


@dataclass(frozen=True)
class SweepConfig:
    contexts: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    new_tokens: int = 64
    repeats: int = 1
    cache_budget_bytes: int | None = None     # None: default_budget()
    adaptive: bool = False                    # the width policy instead of the full block

    def __post_init__(self):
        for name in ("contexts", "batches"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ConfigError(f"{name} must be integers >= 1, got {list(values)}")
        for name in ("new_tokens", "repeats"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cache_budget_bytes is not None and self.cache_budget_bytes < 1:
            raise ConfigError(f"cache_budget_bytes must be >= 1, got {self.cache_budget_bytes}")


def default_budget(device: torch.device) -> int:
    """A quarter of the machine's memory on the CPU; 80% of the free memory on a GPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.8)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


def plan_cells(target, drafter, cfg: SweepConfig) -> tuple[list[dict], list[str], int]:
    """The cells to run (context capped at the model's limit), or a ConfigError naming every cell whose
    KV cache (target + drafter, batch rows of context + new tokens) exceeds the budget."""
    lookahead = drafter.config.num_draft_tokens if drafter is not None else 0
    longest = target.config.max_position_embeddings - cfg.new_tokens - lookahead - 1
    if longest < 1:
        raise ConfigError(f"new_tokens {cfg.new_tokens} leaves no room for a context under the target's "
                          f"max_position_embeddings={target.config.max_position_embeddings}")
    notes, contexts = [], []
    for c in cfg.contexts:
        if c > longest:
            notes.append(f"context {c} capped at {longest} (max_position_embeddings="
                         f"{target.config.max_position_embeddings} - {cfg.new_tokens} new tokens - {lookahead + 1})")
        if min(c, longest) not in contexts:
            contexts.append(min(c, longest))
    budget = cfg.cache_budget_bytes or default_budget(target.device)
    cells, refused = [], []
    for c in contexts:
        for b in cfg.batches:         # what sized_engine allocates for the speculative engine (the larger)
            need = default_cache_budget(target, drafter, -(-(c + cfg.new_tokens + 1) // PAGE_SIZE) * PAGE_SIZE, b)
            cells.append({"context": c, "batch": b, "cache_bytes": need})
            if need > budget:
                refused.append(f"context={c} batch={b} needs {_size(need)}")
    if refused:
        raise ConfigError(f"{len(refused)} of {len(cells)} cells do not fit the KV cache budget of {_size(budget)} "
                          f"(--cache-budget): {'; '.join(refused)}")
    return cells, notes, budget


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


def corpus_ids(tokenizer, need: int) -> list[int]:
    """At least `need` token ids of real text: HumanEval's problems, tiled."""
    with gzip.open(humaneval_path(), "rt") as f:
        text = "\n\n".join(json.loads(line)["prompt"] for line in f if line.strip())
    ids = tokenizer.encode(text, add_special_tokens=False)
    return (ids * (need // len(ids) + 1))[:need]


def _decode_rate(engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]], list[int]]:
    """Prefill every row, then time the decode steps alone: (tokens/s, tokens per row, acceptance lengths)."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    seqs = [engine.seqs[engine.add_request(p, params)] for p in prompts]
    while any(not s.generated and not s.is_finished for s in seqs):
        engine.step()
    before = sum(len(s.generated) for s in seqs)
    started = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    seconds = time.perf_counter() - started
    tokens = sum(len(s.generated) for s in seqs) - before
    out = [list(s.generated) for s in seqs], [a for s in seqs for a in s.acceptance_lengths]
    for s in seqs:
        engine.seqs.pop(s.request_id, None)
    return (tokens / seconds if seconds > 0 else 0.0), *out


def run_sweep(target, drafter, tokenizer, cfg: SweepConfig, progress: bool = True, on_cell=None) -> dict:
    """Every cell, plain and speculative side by side. `on_cell(report)` gets the report so far after each
    cell (`"complete": False` until the last), so a long sweep that is stopped keeps what it measured."""
    cells, notes, budget = plan_cells(target, drafter, cfg)                 # refuses before any work
    from tqdm import tqdm

    corpus = corpus_ids(tokenizer, max(c["context"] for c in cells) + 997 * max(cfg.batches))
    bar = tqdm(total=len(cells) * cfg.repeats * 2, desc="sweep", unit="run", disable=not progress)
    results = []

    def report(complete: bool) -> dict:
        return {"cells": results, "notes": notes, "config": {**asdict(cfg), "cache_budget_bytes": budget},
                "torch_threads": torch.get_num_threads(), "complete": complete}

    for cell in cells:
        c, b = cell["context"], cell["batch"]
        bar.set_postfix_str(f"context {c} batch {b}")
        prompts = [corpus[997 * i: 997 * i + c] for i in range(b)]           # a different slice per row
        engines = {"plain": sized_engine(target, None, b, c + cfg.new_tokens + 1, frozenset(), False),
                   "spec": sized_engine(target, drafter, b, c + cfg.new_tokens + 1, frozenset(), cfg.adaptive)}
        rates = {"plain": [], "spec": []}
        tokens, lengths = {}, []
        for _ in range(cfg.repeats):
            for mode, engine in engines.items():
                rate, tokens[mode], al = _decode_rate(engine, prompts, cfg.new_tokens)
                rates[mode].append(rate)
                lengths = al if mode == "spec" else lengths
                bar.update(1)
        plain, spec = statistics.median(rates["plain"]), statistics.median(rates["spec"])
        ratios = [s / p for s, p in zip(rates["spec"], rates["plain"]) if p]   # within a repeat: same machine state
        results.append({"context": c, "batch": b, "plain_tok_s": plain, "spec_tok_s": spec,
                        "speedup": statistics.median(ratios) if ratios else None,
                        "mean_al": sum(lengths) / len(lengths) if lengths else None,
                        "identical": tokens["plain"] == tokens["spec"], "cache_bytes": cell["cache_bytes"]})
        del engines
        if on_cell is not None and len(results) < len(cells):
            on_cell(report(False))
    bar.close()
    return report(True)

def sweep_table(report: dict) -> str:
    """Speedup per cell: contexts down, batch sizes across."""
    cells = report["cells"]
    contexts = sorted({c["context"] for c in cells})
    batches = sorted({c["batch"] for c in cells})
    by = {(c["context"], c["batch"]): c for c in cells}
    rows = ["| context \\ batch | " + " | ".join(str(b) for b in batches) + " |",
            "|---|" + "---|" * len(batches)]
    for ctx in contexts:
        rows.append(f"| {ctx} | " + " | ".join(
            "not run" if (c := by.get((ctx, b))) is None else
            f"{c['speedup']:.2f}× ({c['plain_tok_s']:.0f}→{c['spec_tok_s']:.0f} tok/s, AL {c['mean_al']:.2f})"
            for b in batches) + " |")
    return "\n".join(rows)


def plot_sweep(report: dict, path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = report["cells"]
    contexts = sorted({c["context"] for c in cells})
    batches = sorted({c["batch"] for c in cells})
    by = {(c["context"], c["batch"]): c for c in cells}
    # a stopped sweep's report lacks its last cells: blank (NaN) in the grid
    grid = [[by[ctx, b]["speedup"] if (ctx, b) in by else float("nan") for b in batches] for ctx in contexts]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(batches), 1.2 + 0.8 * len(contexts)))
    span = max(abs(v - 1) for row in grid for v in row if v == v) or 0.1
    im = ax.imshow(grid, cmap="RdYlGn", vmin=1 - span, vmax=1 + span, aspect="auto")
    for i, ctx in enumerate(contexts):
        for j, b in enumerate(batches):
            cell = by.get((ctx, b))
            if cell is None:
                ax.text(j, i, "not run", ha="center", va="center", fontsize=8)
                continue
            dark = abs(cell["speedup"] - 1) > 0.6 * span
            ax.text(j, i, f"{cell['speedup']:.2f}×\nAL {cell['mean_al']:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if dark else "black")
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_yticks(range(len(contexts)), [str(c) for c in contexts])
    ax.set_xlabel("batch size")
    ax.set_ylabel("context length (tokens)")
    ax.set_title(title or "speculative ÷ plain decode tokens/s", fontsize=9)
    fig.colorbar(im, ax=ax, label="speedup")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sweep(target=None, drafter=DEFAULT_DRAFTER, cfg: SweepConfig | None = None, out=None, progress: bool = True,
          **llm_kwargs) -> dict:
    """Load `target` and `drafter` as `generate` does (`llm_kwargs`: dtype, quantization, device, mode),
    run the sweep, and write OUT/sweep.json and OUT/sweep.png when `out` is given."""
    from pathlib import Path

    from ..llm import LLM, target_dir_of
    from ..numerics import cpu_model

    cfg = cfg or SweepConfig()
    if drafter is None or str(drafter) == "none":
        raise ConfigError("--sweep compares plain and speculative decoding: it needs a drafter, got none")
    llm = LLM(target=target, drafter=drafter, max_batch=1, max_model_len=64, adaptive_speculation=False,
              **llm_kwargs)
    about = dict(target=str(target_dir_of(target)), drafter=str(drafter), numerics=llm.numerics,
                 machine=cpu_model() if llm.target.device.type == "cpu" else torch.cuda.get_device_name())
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)

    def write(report: dict) -> None:
        if out is not None:
            (out / "sweep.json").write_text(json.dumps({**report, **about}, indent=1) + "\n")

    report = {**run_sweep(llm.target, llm.drafter, llm.tokenizer, cfg, progress, on_cell=write), **about}
    write(report)
    if out is not None:
        plot_sweep(report, out / "sweep.png", f"speculative ÷ plain decode tok/s ({llm.drafter.config.kind}, "
                   f"{llm.numerics['dtype']}/{llm.numerics['quantization']}, {report['torch_threads']} thread(s))")
    return report
