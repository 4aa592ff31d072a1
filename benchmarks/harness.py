"""What every benchmark script shares: where results go, figures, side-by-side timing, the common
flags and sub-commands, prompts, and random targets in published families' shapes.

A shared machine's speed drifts by 10-20% over minutes, so a script runs the modes it compares in one
process, each once per round in an order that flips every round, and reports medians of ratios taken
within a round. Results go to benchmarks/results/NAME.json (not in git); the figures docs/benchmarks.md
cites to docs/data/NAME.png. This module knows nothing about what a benchmark measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable, TypeVar

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "docs" / "data"
T = TypeVar("T")


# --- results and figures -------------------------------------------------------------------------

def write_json(path: str | Path, report: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def write_results(name: str, report: dict) -> Path:
    """`report` as benchmarks/results/NAME.json."""
    return write_json(RESULTS / f"{name}.json", report)


def new_figure(**subplots):
    """(fig, axes) from `plt.subplots(**subplots)` on the Agg backend, or None without matplotlib
    (the bench extra): a benchmark still writes its JSON."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(**subplots)


def save_figure(fig, name: str, folder: Path = FIGURES) -> None:
    """`fig` as FOLDER/NAME.png (default docs/data: the figures docs/benchmarks.md cites)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(folder / f"{name}.png", dpi=110)
    plt.close(fig)


# --- side-by-side timing -------------------------------------------------------------------------

def clock(fn: Callable[[], T]) -> tuple[float, T]:
    """(wall seconds, result) of one call of `fn`."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def round_order(names, r: int) -> list:
    """The modes' order in round `r`, from a balanced Latin square (Williams): over n rounds (2n for an odd
    number n of modes) every mode runs equally often in each position and right after each other mode. What
    ran just before a mode sets what it finds in the caches (another process's weights evict its own from a
    shared L3), so each mode follows each other equally often. Two modes: as given, then reversed."""
    names = list(names)
    n = len(names)
    if n < 2:
        return names
    first = [0] + [(k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n)]     # 0, 1, n-1, 2, n-2, ...
    row = [(i + r) % n for i in first]
    if n % 2 and (r // n) % 2:
        row.reverse()
    return [names[i] for i in row]


def side_by_side(modes: dict[str, Callable[[], T]], rounds: int,
                 log: Callable[[int, dict[str, T]], None] | None = None) -> dict[str, list[T]]:
    """Every mode once per round, in `round_order`: {mode: its result in each round}. `log(r, last)`
    sees each round's results."""
    out: dict[str, list[T]] = {m: [] for m in modes}
    for r in range(rounds):
        for m in round_order(modes, r):
            out[m].append(modes[m]())
        if log is not None:
            log(r, {m: v[-1] for m, v in out.items()})
    return out


def ratios(xs: list[float], ys: list[float]) -> list[float]:
    """x / y per round: ratios taken within a round, where the machine's drift cancels."""
    return [x / y for x, y in zip(xs, ys)]


def median_ratio(xs: list[float], ys: list[float]) -> float:
    return statistics.median(ratios(xs, ys))


# --- flags and sub-commands ----------------------------------------------------------------------

class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults beside each flag, docstrings as written."""


def add_threads(ap, default: int | None = 1) -> None:
    ap.add_argument("--threads", type=int, default=default,
                    help="torch CPU threads" + (" (none: torch's default)" if default is None else ""))


def add_repeats(ap, default: int) -> None:
    ap.add_argument("--repeats", "--rounds", dest="repeats", type=int, default=default,
                    help="rounds: every mode once per round, side by side")


def add_prompts(ap, prompts: int | None, tokens: int) -> None:
    if prompts is not None:
        ap.add_argument("--prompts", type=int, default=prompts, help="prompts (the first N of the set)")
    ap.add_argument("--tokens", "--max-new-tokens", "--max-tokens", dest="tokens", type=int, default=tokens,
                    help="tokens generated per prompt at most")


Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], "int | None"]]


def run_commands(doc: str, commands: dict[str, Command], default: Command | None = None,
                 argv: list[str] | None = None) -> int:
    """Parse `argv` into one of `commands` ({name: (add its flags, run it)}; each run function's
    docstring is its help) or, with no sub-command, `default` (its flags at the top level); set
    `--threads` where the command has it; run it."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=_Help)
    if default is not None:
        default[0](ap)
    if commands:
        sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=default is None)
        for name, (flags, run) in commands.items():
            flags(sub.add_parser(name, help=run.__doc__.splitlines()[0], description=run.__doc__,
                                 formatter_class=_Help))
    args = ap.parse_args(argv)
    command = getattr(args, "command", None)
    run = commands[command][1] if command else default[1]
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    return run(args) or 0


# --- prompts -------------------------------------------------------------------------------------

def chat_prompts(tokenizer, n: int) -> tuple[list[list[int]], list[str]]:
    """The bench chat set's first `n` prompts as one user turn each: chat-template ids, and the rendered
    text (for runtimes that tokenize themselves)."""
    from blockdraft.bench.prompt_sets import load_set

    turns = [[{"role": "user", "content": t}] for t in load_set("chat", n)]
    return [tokenizer.encode_chat(t) for t in turns], [tokenizer.apply_chat_template(t) for t in turns]


def tiny_prompts(n: int, seed: int) -> list[list[int]]:
    """`n` random prompts of 8-39 ids for the tiny shipped fixtures (vocab 128; 124+ left out)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 124, (int(k),), generator=g).tolist() for k in torch.randint(8, 40, (n,), generator=g)]


# --- random targets in published families' shapes -----------------------------------------------

def _layer_types(n: int, full_every: int, state: str, full_at: tuple[int, ...] = ()) -> tuple[str, ...]:
    return tuple("full_attention" if (i + 1) % full_every == 0 or i in full_at else state for i in range(n))


def shaped_configs() -> dict:
    """Random models with a published family's layer pattern and head geometry (no checkpoint ships):
    SmolLM2-135M's (the default model: Llama, 30 layers, 576 wide); Qwen3.5 at a small width (18 Gated
    DeltaNet + 6 gated-attention layers); LFM2-1.2B as published (10 short-conv + 6 attention layers);
    LFM2-8B-A1B's MoE (32 experts, top-4, sigmoid router, 2 dense layers) at half its width and depth, so
    that it fits beside the others in memory; gpt-oss-20b's MoE (32 experts, top-4, biases, clamped
    SwiGLU; sliding window 128 on every other layer, sinks) at 1024 wide and 8 deep; Gemma 4 26B-A4B's
    (128 experts, top-8 beside a GeGLU MLP; 5:1 sliding/full, full layers with their own head geometry
    and V = K) at 1024 wide and 12 deep."""
    from blockdraft.config import DeltaNetConfig, MoeConfig, RopeConfig, ShortConvConfig, TargetConfig
    lfm2_full = (2, 5, 8, 10, 12, 14)
    return {
        "smollm2": TargetConfig(
            architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
            num_heads=9, num_kv_heads=3, head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
            tie_word_embeddings=True),
        "qwen3.5": TargetConfig(
            architecture="qwen3_5", vocab_size=32000, hidden_size=1024, intermediate_size=3584, num_layers=24,
            num_heads=8, num_kv_heads=2, head_dim=256, max_position_embeddings=4096, qk_norm=True,
            layer_types=_layer_types(24, 4, "linear_attention"),
            deltanet=DeltaNetConfig(num_k_heads=16, num_v_heads=16, k_dim=128, v_dim=128, conv_kernel=4),
            partial_rotary_factor=0.25, attn_output_gate=True, norm_offset=True),
        "lfm2": TargetConfig(
            architecture="lfm2", vocab_size=65536, hidden_size=2048, intermediate_size=8192, num_layers=16,
            num_heads=32, num_kv_heads=8, head_dim=64, max_position_embeddings=4096, qk_norm=True,
            tie_word_embeddings=True, layer_types=_layer_types(16, 10 ** 6, "short_conv", lfm2_full),
            short_conv=ShortConvConfig(conv_dim=2048, conv_kernel=3)),
        "lfm2-moe": TargetConfig(
            architecture="lfm2_moe", vocab_size=65536, hidden_size=1024, intermediate_size=3584, num_layers=12,
            num_heads=16, num_kv_heads=4, head_dim=64, max_position_embeddings=4096, qk_norm=True,
            tie_word_embeddings=True, layer_types=_layer_types(12, 10 ** 6, "short_conv", (2, 5, 8, 10)),
            short_conv=ShortConvConfig(conv_dim=1024, conv_kernel=3),
            moe=MoeConfig(num_experts=32, top_k=4, expert_intermediate_size=896, router="sigmoid",
                          expert_bias=True, dense_layers=2)),
        "gpt-oss": TargetConfig(
            architecture="gpt_oss", vocab_size=65536, hidden_size=1024, intermediate_size=1024, num_layers=8,
            num_heads=16, num_kv_heads=4, head_dim=64, max_position_embeddings=4096, attention_bias=True,
            layer_types=("sliding_attention", "full_attention") * 4, sliding_window=128, attention_sinks=True,
            moe=MoeConfig(num_experts=32, top_k=4, expert_intermediate_size=1024, router="topk_softmax",
                          biases=True, activation="clamped_swiglu")),
        "gemma4-moe": TargetConfig(
            architecture="gemma4", vocab_size=65536, hidden_size=1024, intermediate_size=768, num_layers=12,
            num_heads=8, num_kv_heads=4, head_dim=128, max_position_embeddings=4096, qk_norm=True,
            tie_word_embeddings=True, layer_types=_layer_types(12, 6, "sliding_attention"), sliding_window=128,
            global_head_dim=256, global_kv_heads=2, attention_k_eq_v=True, hidden_act="gelu_tanh",
            global_rope=RopeConfig(theta=1e6, rope_type="proportional", partial_rotary_factor=0.25),
            final_logit_softcapping=30.0,
            moe=MoeConfig(num_experts=128, top_k=8, expert_intermediate_size=256, router="normed_softmax",
                          activation="gelu_tanh")),
    }


def shaped(cfg):
    """A bf16 TargetModel of `cfg`, its weights drawn from N(0, 0.02) under seed 0."""
    from blockdraft.models.target import TargetModel
    torch.manual_seed(0)
    with torch.device("meta"):
        model = TargetModel(cfg)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
        for name, b in model.named_buffers():     # to_empty left them unset: routing biases 0, layer scalars 1
            b.fill_(1.0 if name.endswith("layer_scalar") else 0.0)
    model.tie_weights()
    return model.to(torch.bfloat16).eval().requires_grad_(False)


def hybrid_step(t, cache, ids: torch.Tensor, context: int, keep: int) -> float:
    """Time one pass over ids plus the commit of `keep` rows; then put the state and length back."""
    pool = cache.states
    state = [*pool.windows.values(), *pool.rec.values()]
    saved = [x.clone() for x in state]
    t0 = time.perf_counter()
    t(ids, cache)
    cache.truncate(context + keep)
    spent = time.perf_counter() - t0
    for x, y in zip(state, saved):
        x.copy_(y)
    cache.length = context
    return spent
