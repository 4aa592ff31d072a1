"""The benchmark: per prompt set, temperature and batch size, AR vs each drafter vs HF `generate`.

Every blockdraft mode runs through the batch engine — the path `serve` and `generate` run —
with the draft width chosen by measured cost unless `adaptive` is off. Modes run side by side
for each group of `batch` prompts (AR, drafters, HF, in that order), so machine noise hits them
alike; each repeat gives a tokens/s per mode (generated tokens / wall time, prefill included,
as HF's is) and a speedup vs AR in the same repeat; the report keeps the medians. Acceptance
statistics come from the first repeat (seeded, so repeats agree). HF runs batch 1 only.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..errors import ConfigError
from ..engine.engine import sized_engine
from ..loading import load_drafter, load_target
from ..sampling.params import SamplingParams
from ..tokenizer import Tokenizer
from .prompt_sets import SETS, load_set


@dataclass(frozen=True)
class BenchConfig:
    sets: tuple[str, ...] = SETS
    prompts_per_set: int = 8
    max_new_tokens: int = 128
    temperatures: tuple[float, ...] = (0.0, 1.0)
    repeats: int = 3
    hf_baseline: bool = True
    dtype: str = "bfloat16"
    quantization: str = "none"     # the target's weight-only scheme (the HF baseline stays at `dtype`)
    device: str = "cpu"
    seed: int = 0
    batch_sizes: tuple[int, ...] = (1,)
    adaptive: bool = True              # draft width from measured cost (what serve/generate run)


@dataclass
class ModeStats:
    tokens_per_s: list[float] = field(default_factory=list)      # per repeat
    speedup_vs_ar: list[float] = field(default_factory=list)     # per repeat
    acceptance_lengths: list[int] = field(default_factory=list)  # every verify step, first repeat
    tokens: int = 0
    greedy_matches_ar: int = 0                                   # prompts whose tokens equal AR's (T=0)

    def summary(self, block: int | None) -> dict:
        out = {"tokens_per_s": statistics.median(self.tokens_per_s) if self.tokens_per_s else None,
               "tokens_per_s_repeats": self.tokens_per_s, "tokens": self.tokens,
               "speedup_vs_ar": statistics.median(self.speedup_vs_ar) if self.speedup_vs_ar else None,
               "greedy_matches_ar": self.greedy_matches_ar}
        if block:
            out.update(acceptance_summary(self.acceptance_lengths, block))
        return out


def acceptance_summary(lengths: list[int], max_len: int) -> dict:
    """Mean AL, histogram over 1..max_len, and per-position acceptance: the share of verify steps
    whose draft k (k = 1..max_len-1) was accepted."""
    steps = max(1, len(lengths))
    hist = [sum(1 for a in lengths if a == k) for k in range(1, max_len + 1)]
    return {"mean_al": sum(lengths) / steps if lengths else None, "steps": len(lengths), "al_histogram": hist,
            "per_position_acceptance": [sum(1 for a in lengths if a > k) / steps for k in range(1, max_len)]}


class HFBaseline:
    """The same prompts through transformers' `generate` (same weights, same dtype)."""

    def __init__(self, target_dir: Path, dtype: torch.dtype, eos_ids: list[int], device: str | torch.device = "cpu"):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).to(device).eval()
        self.eos_ids = eos_ids

    @torch.inference_mode()
    def generate(self, prompt: list[int], params: SamplingParams) -> list[int]:
        ids = torch.tensor([prompt], device=self.model.device)
        sample = params.temperature > 0
        if sample:
            torch.manual_seed(params.seed or 0)
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=params.max_tokens,
                                  do_sample=sample, temperature=params.temperature if sample else None,
                                  top_k=0 if sample else None, top_p=1.0 if sample else None,
                                  eos_token_id=self.eos_ids, pad_token_id=self.eos_ids[0])
        return out[0, len(prompt):].tolist()


def run_bench(target_dir: Path, drafter_dirs: dict[str, Path], cfg: BenchConfig, tp=None) -> dict:
    """`tp`: a TPGroup when this is one rank of a tensor-parallel run (models are sharded; rank 0
    alone runs the HF baseline and shows progress)."""
    target = load_target(target_dir, cfg.dtype, cfg.quantization, cfg.device)
    drafters = {name: load_drafter(path, target, target_dir=target_dir) for name, path in drafter_dirs.items()}
    if tp is not None and tp.world > 1:
        from ..parallel.shard import shard_models

        shard_models(target, drafters.values(), tp)
    tok = Tokenizer(target_dir)
    eos = sorted(set(target.config.eos_token_ids) | ({tok.eos_token_id} if tok.eos_token_id is not None else set()))
    on_rank0 = tp is None or tp.rank == 0
    hf = HFBaseline(target_dir, target.dtype, eos, target.device) if cfg.hf_baseline and on_rank0 else None
    modes = ["ar", *drafters] + (["hf"] if cfg.hf_baseline else [])
    prompts = {s: [tok.encode_chat([{"role": "user", "content": p}]) for p in load_set(s, cfg.prompts_per_set)]
               for s in cfg.sets}
    limit = target.config.max_position_embeddings
    for set_name, set_prompts in prompts.items():  # refuse before any work starts
        for i, p in enumerate(set_prompts):
            if len(p) + cfg.max_new_tokens > limit:
                raise ConfigError(f"set {set_name!r} prompt {i}: {len(p)} tokens + max_new_tokens "
                                  f"{cfg.max_new_tokens} exceeds max_position_embeddings={limit}")
    if any(b < 1 for b in cfg.batch_sizes):
        raise ConfigError(f"batch sizes must be >= 1, got {list(cfg.batch_sizes)}")
    longest = max(len(p) for ps in prompts.values() for p in ps) + cfg.max_new_tokens + 1
    adaptive = cfg.adaptive and (tp is None or tp.world == 1)      # timings differ between ranks
    engines = {m: sized_engine(target, drafters.get(m), max(cfg.batch_sizes), longest, frozenset(eos), adaptive)
               for m in modes if m != "hf"}
    from tqdm import tqdm

    groups = sum(-(-len(ps) // b) for ps in prompts.values() for b in cfg.batch_sizes)
    bar = tqdm(total=cfg.repeats * len(cfg.temperatures) * groups * len(modes), desc="bench", unit="run",
               disable=not on_rank0)
    results: dict = {}
    for batch in cfg.batch_sizes:
        for set_name, set_prompts in prompts.items():
            for temp in cfg.temperatures:
                run_modes = [m for m in modes if m != "hf" or batch == 1]
                stats = {m: ModeStats() for m in run_modes}
                for rep in range(cfg.repeats):
                    seconds, counts = dict.fromkeys(run_modes, 0.0), dict.fromkeys(run_modes, 0)
                    for lo in range(0, len(set_prompts), batch):
                        group = set_prompts[lo:lo + batch]
                        params = [SamplingParams(max_tokens=cfg.max_new_tokens, temperature=temp,
                                                 seed=cfg.seed + lo + i if temp > 0 else None)
                                  for i in range(len(group))]
                        ar_tokens = None
                        for mode in run_modes:
                            t0 = time.perf_counter()
                            if mode == "hf":
                                outs = [(hf.generate(group[0], params[0]) if hf else [], [])]
                            else:
                                outs = [(o.token_ids, o.acceptance_lengths)
                                        for o in engines[mode].generate(group, params)]
                            seconds[mode] += time.perf_counter() - t0
                            counts[mode] += sum(len(t) for t, _ in outs)
                            if mode == "ar":
                                ar_tokens = [t for t, _ in outs]
                            if rep == 0:
                                for (tokens, lengths), ref in zip(outs, ar_tokens):
                                    stats[mode].acceptance_lengths += lengths
                                    stats[mode].tokens += len(tokens)
                                    stats[mode].greedy_matches_ar += int(temp == 0 and tokens == ref)
                            bar.update(1)
                    tps = {m: counts[m] / seconds[m] if seconds[m] else 0.0 for m in run_modes}
                    for m in run_modes:
                        stats[m].tokens_per_s.append(tps[m])
                        stats[m].speedup_vs_ar.append(tps[m] / tps["ar"] if tps["ar"] else 0.0)
                key = f"T={temp:g}" if cfg.batch_sizes == (1,) else f"T={temp:g},batch={batch}"
                results.setdefault(set_name, {})[key] = {
                    m: stats[m].summary(drafters[m].config.num_draft_tokens + 1 if m in drafters else None)
                    for m in run_modes}
    bar.close()
    return {"config": asdict(cfg), "target": str(target_dir), "drafters": {k: str(v) for k, v in drafter_dirs.items()},
            "torch_threads": torch.get_num_threads(), "tp": 1 if tp is None else tp.world, "results": results}


def bench_task(tp, payload) -> dict:
    """One rank of `bench --tp N`."""
    target_dir, drafter_dirs, cfg = payload
    return run_bench(target_dir, drafter_dirs, cfg, tp=tp)


def table(report: dict) -> str:
    """A markdown table: one row per set × temperature × mode."""
    rows = ["| set | T | mode | tok/s | speedup vs AR | mean AL | greedy = AR |", "|---|---|---|---|---|---|---|"]
    for set_name, temps in report["results"].items():
        for temp, modes in temps.items():
            n = report["config"]["prompts_per_set"]
            for mode, s in modes.items():
                al = f"{s['mean_al']:.2f}" if s.get("mean_al") else "–"
                same = f"{s['greedy_matches_ar']}/{n}" if temp.startswith("T=0") and mode != "ar" else "–"
                rows.append(f"| {set_name} | {temp[2:]} | {mode} | {s['tokens_per_s']:.1f} | "
                            f"{s['speedup_vs_ar']:.2f}× | {al} | {same} |")
    return "\n".join(rows)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    drafters = list(report["drafters"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    labels, width = [], 0.8 / (len(drafters) + 1)
    keys = [(s, t) for s, temps in results.items() for t in temps]
    for j, mode in enumerate(drafters + (["hf"] if report["config"]["hf_baseline"] else [])):
        ax1.bar([i + j * width for i in range(len(keys))], [results[s][t][mode]["speedup_vs_ar"] for s, t in keys],
                width, label=mode)
    labels = [f"{s}\n{t}" for s, t in keys]
    ax1.set_xticks([i + width * len(drafters) / 2 for i in range(len(keys))], labels, fontsize=8)
    ax1.axhline(1.0, color="gray", lw=0.8)
    ax1.set_ylabel("tokens/s ÷ our AR (batch 1)")
    ax1.legend()
    for mode in drafters:
        for s, t in keys:
            if not t.startswith("T=0"):
                continue
            curve = results[s][t][mode]["per_position_acceptance"]
            ax2.plot(range(1, len(curve) + 1), curve, marker="o", label=f"{mode} {s}")
    ax2.set_xlabel("draft position k")
    ax2.set_ylabel("share of steps with draft k accepted (greedy)")
    ax2.set_ylim(0, 1)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
