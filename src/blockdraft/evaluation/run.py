"""`blockdraft eval`: one prompt set answered twice by the same target in the same numerics —
plainly and with the drafter — scored, and compared.

Both arms run through the batch engine (`max_batch` requests at a time). Greedy answers must be
identical token for token (speculation is lossless); `identical` counts them and `mismatches`
names the items that are not. Sampled answers differ by construction (each arm draws its own
tokens from the same seeds), so there the paired McNemar test decides whether accuracy moved.
The speculative arm drafts the drafter's full block on every step unless `adaptive` is on, so
the acceptance lengths measure the drafter rather than the width policy.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from ..bench.run import acceptance_summary
from ..engine.engine import sized_engine
from ..errors import ConfigError
from ..sampling.params import SamplingParams
from ..tokenizer import TextStream
from .sets import SETS, EvalItem, is_scored, load_items, score
from .stats import mcnemar_exact, mean_al_ci, paired_counts


@dataclass(frozen=True)
class EvalConfig:
    set: str = "math"                   # humaneval, math, chat, or lm-eval:TASK
    prompts: int | None = None          # the first N items of the set (None: all)
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0                       # item i samples with seed + i in both arms
    max_batch: int = 8
    exec_timeout_s: float = 5.0         # HumanEval: wall-clock limit per program
    adaptive: bool = False              # the width policy (generate/serve's default) instead of the full block
    compare_plain: bool = True          # False: the speculative arm alone (acceptance only, e.g. a gate)

    def __post_init__(self):
        if self.set not in SETS and not (self.set.startswith("lm-eval:") and len(self.set) > len("lm-eval:")):
            raise ConfigError(f"set: unknown eval set {self.set!r}; choose from {', '.join(SETS)} or lm-eval:TASK")
        for name, low in (("prompts", 1), ("max_new_tokens", 1), ("max_batch", 1), ("top_k", 0)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < low):
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if not self.temperature >= 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not self.exec_timeout_s > 0:
            raise ConfigError(f"exec_timeout_s must be > 0, got {self.exec_timeout_s!r}")


def encode_items(tokenizer, items: list[EvalItem], cfg: EvalConfig, max_len: int) -> list[list[int]]:
    """Chat-template every item; refuse (naming the item) any that cannot fit `max_len` with its answer."""
    prompts = [tokenizer.encode_chat([{"role": "user", "content": it.prompt}]) for it in items]
    for it, p in zip(items, prompts):
        if len(p) + cfg.max_new_tokens > max_len:
            raise ConfigError(f"set {cfg.set!r} item {it.id}: {len(p)} prompt tokens + max_new_tokens "
                              f"{cfg.max_new_tokens} exceeds the target's limit of {max_len} tokens")
    return prompts


def _arm(engine, prompts: list[list[int]], cfg: EvalConfig) -> tuple[list, float]:
    params = [SamplingParams(max_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                             top_k=cfg.top_k, seed=cfg.seed + i if cfg.temperature > 0 else None)
              for i in range(len(prompts))]
    started = time.perf_counter()
    outs = engine.generate(prompts, params)
    return outs, time.perf_counter() - started


def _scored(cfg, items, outs, decode) -> tuple[list[str], list]:
    texts = [TextStream(decode, None).text(o.token_ids) for o in outs]
    return texts, [score(cfg.set, it, t, cfg.exec_timeout_s) for it, t in zip(items, texts)]


def _arm_summary(outs, seconds: float, results) -> dict:
    tokens = sum(len(o.token_ids) for o in outs)
    correct = [ok for ok, _ in results]
    scored = [ok for ok in correct if ok is not None]
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else None,
            "correct": sum(scored) if scored else None,
            "accuracy": sum(scored) / len(scored) if scored else None}


def run_eval(target, drafter, tokenizer, eos_ids: frozenset[int], cfg: EvalConfig) -> dict:
    """Evaluate `drafter` on `target` (both loaded); the report `blockdraft eval --json` prints."""
    if drafter is None:
        raise ConfigError("eval compares decoding with and without a drafter; --drafter none leaves nothing "
                          "to compare")
    items = load_items(cfg.set, cfg.prompts)
    prompts = encode_items(tokenizer, items, cfg, target.config.max_position_embeddings)
    longest = max(len(p) for p in prompts) + cfg.max_new_tokens + 1
    batch = min(cfg.max_batch, len(prompts))
    spec_engine = sized_engine(target, drafter, batch, longest, eos_ids, cfg.adaptive)
    plain_engine = sized_engine(target, None, batch, longest, eos_ids, False) if cfg.compare_plain else None
    spec_outs, spec_s = _arm(spec_engine, prompts, cfg)
    spec_texts, spec_res = _scored(cfg, items, spec_outs, tokenizer.decode)
    block = drafter.config.num_draft_tokens + 1
    al = mean_al_ci([o.acceptance_lengths for o in spec_outs])
    lengths = [a for o in spec_outs for a in o.acceptance_lengths]
    speculative = {**_arm_summary(spec_outs, spec_s, spec_res), "mean_al": al["mean_al"], "al_ci95": al["ci95"],
                   "steps": al["steps"], **{k: v for k, v in acceptance_summary(lengths, block).items()
                                            if k in ("al_histogram", "per_position_acceptance")}}
    report = {"set": cfg.set, "items": len(items), "scored": is_scored(cfg.set), "greedy": cfg.temperature == 0,
              "drafter_kind": drafter.config.kind, "block_size": drafter.config.block_size,
              "config": asdict(cfg), "speculative": speculative}
    rows = [{"id": it.id, "speculative": ok, "speculative_why": why} for it, (ok, why) in zip(items, spec_res)]
    if plain_engine is not None:
        plain_outs, plain_s = _arm(plain_engine, prompts, cfg)
        plain_texts, plain_res = _scored(cfg, items, plain_outs, tokenizer.decode)
        report["plain"] = _arm_summary(plain_outs, plain_s, plain_res)
        same = [p.token_ids == s.token_ids for p, s in zip(plain_outs, spec_outs)]
        report["identical"] = sum(same)
        report["mismatches"] = [it.id for it, ok in zip(items, same) if not ok]
        p, s = report["plain"], speculative
        report["speedup"] = s["tokens_per_s"] / p["tokens_per_s"] if p["tokens_per_s"] else None
        if is_scored(cfg.set):
            table = paired_counts([ok for ok, _ in plain_res], [ok for ok, _ in spec_res])
            report["paired"] = {"both": table["both"], "only_plain": table["only_first"],
                                "only_speculative": table["only_second"], "neither": table["neither"],
                                "difference": s["accuracy"] - p["accuracy"],
                                "mcnemar_p": mcnemar_exact(table["only_first"], table["only_second"])}
        for row, same_i, (ok, why), text in zip(rows, same, plain_res, plain_texts):
            row.update(plain=ok, plain_why=why, identical=same_i)
        for row, text in zip(rows, spec_texts):
            row["answer"] = text[:200]
    report["per_item"] = rows
    return report


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _rate(x) -> str:
    return "–" if x is None else f"{x:.1f}"


def table(report: dict) -> str:
    """One screen: both arms side by side, then the paired test and acceptance."""
    s, p = report["speculative"], report.get("plain")
    lines = [f"eval {report['set']}: {report['items']} items, "
             f"{'greedy' if report['greedy'] else 'T=' + str(report['config']['temperature'])}, "
             f"{report['drafter_kind']} block {report['block_size']}", "",
             f"{'':14}{'accuracy':>10}{'tokens':>9}{'tok/s':>9}"]
    if p is not None:
        lines.append(f"{'plain':14}{_pct(p['accuracy']):>10}{p['tokens']:>9}{_rate(p['tokens_per_s']):>9}")
    lines.append(f"{'speculative':14}{_pct(s['accuracy']):>10}{s['tokens']:>9}{_rate(s['tokens_per_s']):>9}")
    lines.append("")
    if "paired" in report:
        q = report["paired"]
        lines.append(f"paired: {q['only_speculative']} right only with drafting, {q['only_plain']} only without; "
                     f"difference {100 * q['difference']:+.1f} pts, exact McNemar p = {q['mcnemar_p']:.3g}")
    if p is not None:
        verdict = "" if not report["greedy"] else ("  (greedy: all identical)" if not report["mismatches"]
                                                  else f"  (greedy: MISMATCH {report['mismatches'][:5]})")
        speedup = f"; speedup {report['speedup']:.2f}x" if report.get("speedup") else ""
        lines.append(f"identical answers: {report['identical']}/{report['items']}{verdict}{speedup}")
    ci = s["al_ci95"]
    ci_text = f" (95% CI {ci[0]:.2f}–{ci[1]:.2f})" if ci else ""
    if s["mean_al"] is None:
        lines.append("no tokens generated (a log-likelihood task): no acceptance to report")
        return "\n".join(lines)
    lines.append(f"mean AL {s['mean_al']:.2f}{ci_text} over {s['steps']} verify steps")
    lines.append("per-position acceptance: " + " ".join(f"{a:.2f}" for a in s["per_position_acceptance"]))
    return "\n".join(lines)
