"""`blockdraft train`: distil a drafter from its target's own greedy text, resumably.

Data: the target's greedy responses to a prompt set (the DFlash/DSpark recipe), generated
by the batch engine, then one teacher-forced pass per sequence records the drafter's taps
and the target's final hidden state (its logits are recomputed from it when a loss needs
them, so the data stays small). Each step draws `seqs_per_step` sequences and
`anchors_per_seq` anchors in each, builds all their blocks at once (`losses.blocks_at`)
and averages the kind's loss. `out_dir` holds `trainer_state.pt` (resume), and at the end
the drafter in its published layout (z-lab DFlash / DeepSeek DSpark, bf16, reusing the
target's embedding and LM head), `training.json` and a plot.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..checkpoints.publish import save_drafter
from ..config import Taps
from ..decode import generate_one
from ..errors import RequestError
from ..models.drafter import BlockDrafter
from ..models.target import TargetModel
from ..sampling.params import SamplingParams
from .losses import blocks_at, dflash_loss, dspark_loss


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200
    lr: float = 3e-3
    warmup: int = 10                  # linear warmup steps, then cosine decay to 10% of lr
    seqs_per_step: int = 2
    anchors_per_seq: int = 8
    seed: int = 0
    save_every: int = 50
    new_tokens: int = 64


@dataclass
class TeacherSeq:
    ids: torch.Tensor     # [L] prompt + the target's response
    taps: torch.Tensor    # [1, L, F] the drafter's tap layers, packed
    final: torch.Tensor   # [L, H] the target's post-norm last hidden (logits = lm_head(final))
    response_start: int   # first response position; anchors start one before it

    @property
    def anchor_range(self) -> tuple[int, int]:
        """[lo, hi): anchors whose first predicted position is a response token."""
        return max(1, self.response_start - 1), len(self.ids) - 1


def _greedy_responses(target: TargetModel, prompts: list[list[int]], new_tokens: int, eos_ids: frozenset[int],
                      max_batch: int, progress: bool) -> list[list[int]]:
    from ..llm import sized_engine

    engine = sized_engine(target, None, max_batch, max(len(p) for p in prompts) + new_tokens, eos_ids)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=not eos_ids)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), desc="teacher responses", unit="seq")
    out = []
    for i in range(0, len(prompts), max_batch):
        chunk = prompts[i:i + max_batch]
        out += [o.token_ids for o in engine.generate(chunk, params)]
        if bar:
            bar.update(len(chunk))
    if bar:
        bar.close()
    return out


@torch.no_grad()
def teacher_data(target: TargetModel, prompts: list[list[int]], new_tokens: int, taps: Taps | tuple[int, ...],
                 eos_ids: frozenset[int] = frozenset(), max_batch: int = 32, progress: bool = False
                 ) -> list[TeacherSeq]:
    """Each prompt + the target's greedy response (stopping at `eos_ids`), with taps (read at the
    drafter's tap point) and the target's final hidden state."""
    responses = _greedy_responses(target, prompts, new_tokens, eos_ids, max_batch, progress)
    seqs = [p + r for p, r in zip(prompts, responses)]
    data: list[TeacherSeq | None] = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for i in range(0, len(order), 16):  # right-padded batches: causal attention keeps the real rows exact
        group = order[i:i + 16]
        longest = len(seqs[group[-1]])
        ids = torch.zeros(len(group), longest, dtype=torch.long)
        for row, j in enumerate(group):
            ids[row, :len(seqs[j])] = torch.tensor(seqs[j])
        out = target(ids, tap_layers=taps, logits_at=torch.zeros(len(group), dtype=torch.long))
        for row, j in enumerate(group):
            n = len(seqs[j])
            data[j] = TeacherSeq(ids[row, :n].clone(), out.taps[row:row + 1, :n].clone(), out.hidden[row, :n].clone(),
                                 len(prompts[j]))
    return data


def mean_acceptance(target: TargetModel, drafter: BlockDrafter, prompts: list[list[int]], new_tokens: int) -> float:
    lengths = []
    for p in prompts:
        lengths += generate_one(target, p, SamplingParams(max_tokens=new_tokens), drafter).acceptance_lengths
    return sum(lengths) / max(1, len(lengths))


def _lr_scale(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    done = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))


def fit(drafter: BlockDrafter, data: list[TeacherSeq], cfg: TrainConfig, state_path: Path | None = None,
        progress: bool = True, head: torch.nn.Linear | None = None) -> list[dict]:
    """The optimisation loop over teacher data; resumes from / checkpoints to `state_path`.

    `head` is the target's LM head (DSpark's loss needs the target distribution).
    """
    usable = [d for d in data if d.anchor_range[1] > d.anchor_range[0]]
    if not usable:
        longest = max((len(d.ids) for d in data), default=0)
        raise RequestError(f"none of the {len(data)} teacher sequences has a response token to predict "
                           f"(longest {longest} tokens); use longer prompts/responses (--new-tokens) or more prompts")
    data = usable
    params = [p for p in drafter.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    start = 0
    if state_path is not None and state_path.is_file():  # resume exactly where we stopped
        state = torch.load(state_path, weights_only=False)
        drafter.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        gen.set_state(state["rng"])
        history, start = state["history"], state["step"]
    dspark = drafter.config.kind == "dspark"
    if dspark and head is None:
        head = drafter.shared.lm_head
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc=f"training {drafter.config.kind}", unit="step")
    drafter.train()
    for step in range(start, cfg.steps):
        for group in opt.param_groups:
            group["lr"] = cfg.lr * _lr_scale(step, cfg)
        opt.zero_grad()
        totals: dict[str, float] = {}
        for _ in range(cfg.seqs_per_step):
            seq = data[int(torch.randint(len(data), (1,), generator=gen))]
            lo, hi = seq.anchor_range
            anchors = lo + torch.randperm(hi - lo, generator=gen)[:cfg.anchors_per_seq]
            block = blocks_at(drafter, seq.taps, seq.final, seq.ids, anchors, head if dspark else None)
            parts = (dspark_loss if dspark else dflash_loss)(drafter, block)
            (parts["loss"] / cfg.seqs_per_step).backward()
            for k, v in parts.items():
                totals[k] = totals.get(k, 0.0) + float(v.detach()) / cfg.seqs_per_step
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append({"step": step + 1, **totals})
        if bar:
            bar.update(1)
            bar.set_postfix(loss=f"{totals.get('loss', 0):.3f}")
        if state_path is not None and ((step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps):
            torch.save({"model": drafter.state_dict(), "optim": opt.state_dict(), "rng": gen.get_state(),
                        "history": history, "step": step + 1}, state_path)
    if bar:
        bar.close()
    drafter.eval().requires_grad_(False)
    return history


def train(drafter: BlockDrafter, target: TargetModel, prompts: list[list[int]], eval_prompts: list[list[int]],
          cfg: TrainConfig, out_dir: Path, progress: bool = True, eos_ids: frozenset[int] = frozenset(),
          data: list[TeacherSeq] | None = None) -> dict:
    """Teacher data → `fit` (resumable) → published checkpoint, training.json, plot."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if data is None:
        data = teacher_data(target, prompts, cfg.new_tokens, drafter.config.taps, eos_ids,
                            progress=progress)
    t0 = time.perf_counter()
    history = fit(drafter, data, cfg, out_dir / "trainer_state.pt", progress, target.lm_head)
    summary = {"config": asdict(cfg), "train_seconds": time.perf_counter() - t0, "history": history,
               "teacher_sequences": len(data), "teacher_tokens": sum(len(d.ids) for d in data),
               "final_loss": history[-1]["loss"] if history else None,
               "validation_mean_al": mean_acceptance(target, drafter, eval_prompts, cfg.new_tokens)}
    save_drafter(drafter, target, out_dir)
    (out_dir / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    _plot(history, out_dir / "training.png", summary["validation_mean_al"])
    return summary


def _plot(history: list[dict], path: Path, validation_al: float | None = None) -> None:
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key in ("loss", "ce", "l1"):
        if history and key in history[0]:
            ax.plot([h["step"] for h in history], [h[key] for h in history], label=key)
    ax.set_xlabel("step")
    if validation_al is not None:
        ax.set_title(f"validation mean acceptance length {validation_al:.2f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
