"""`blockdraft train`: distil a drafter from its target's own greedy text, resumably.

Data: the target's greedy continuations of a prompt set (the DFlash/DSpark recipe),
with taps and target logits recomputed per sequence. Each step averages the
kind's loss over random anchors. `out_dir` holds `trainer_state.pt` (resume), and
at the end the drafter in its published layout (z-lab DFlash / DeepSeek DSpark,
bf16, reusing the target's embedding and LM head), `training.json` and a plot.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..checkpoints.publish import save_drafter
from ..decode import generate_one
from ..models.drafter import BlockDrafter
from ..models.target import TargetModel
from ..sampling.params import SamplingParams
from .losses import block_at, dflash_loss, dspark_loss


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200
    lr: float = 3e-3
    anchors_per_step: int = 8
    seed: int = 0
    save_every: int = 50
    new_tokens: int = 64


@torch.no_grad()
def teacher_data(target: TargetModel, prompts: list[list[int]], new_tokens: int, taps: tuple[int, ...]):
    """(sequence, taps [1, L, F], target logits [L, V]) for each prompt's greedy continuation."""
    data = []
    for p in prompts:
        seq = p + generate_one(target, p, SamplingParams(max_tokens=new_tokens, ignore_eos=True)).token_ids
        out = target(torch.tensor([seq]), tap_layers=taps)
        data.append((torch.tensor(seq), out.taps, out.logits[0]))
    return data


def mean_acceptance(target: TargetModel, drafter: BlockDrafter, prompts: list[list[int]], new_tokens: int) -> float:
    lengths = []
    for p in prompts:
        lengths += generate_one(target, p, SamplingParams(max_tokens=new_tokens), drafter).acceptance_lengths
    return sum(lengths) / max(1, len(lengths))


def fit(drafter: BlockDrafter, data: list, cfg: TrainConfig, state_path: Path | None = None,
        progress: bool = True) -> list[dict]:
    """The optimisation loop over teacher data; resumes from / checkpoints to `state_path`."""
    params = [p for p in drafter.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    start = 0
    if state_path is not None and state_path.is_file():  # resume exactly where we stopped
        state = torch.load(state_path, weights_only=False)
        drafter.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        gen.set_state(state["rng"])
        history, start = state["history"], state["step"]
    loss_fn = dspark_loss if drafter.config.kind == "dspark" else dflash_loss
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc=f"training {drafter.config.kind}", unit="step")
    drafter.train()
    for step in range(start, cfg.steps):
        opt.zero_grad()
        totals: dict[str, float] = {}
        for _ in range(cfg.anchors_per_step):
            seq, taps, logits = data[int(torch.randint(len(data), (1,), generator=gen))]
            block = block_at(drafter, taps, logits, seq, int(torch.randint(1, len(seq) - 1, (1,), generator=gen)))
            if block is None:
                continue
            parts = loss_fn(drafter, block)
            (parts["loss"] / cfg.anchors_per_step).backward()
            for k, v in parts.items():
                totals[k] = totals.get(k, 0.0) + float(v.detach()) / cfg.anchors_per_step
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
          cfg: TrainConfig, out_dir: Path, progress: bool = True) -> dict:
    """Teacher data → `fit` (resumable) → published checkpoint, training.json, plot."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = teacher_data(target, prompts, cfg.new_tokens, drafter.config.target_layer_ids)
    t0 = time.perf_counter()
    history = fit(drafter, data, cfg, out_dir / "trainer_state.pt", progress)
    summary = {"config": asdict(cfg), "train_seconds": time.perf_counter() - t0, "history": history,
               "final_loss": history[-1]["loss"] if history else None,
               "validation_mean_al": mean_acceptance(target, drafter, eval_prompts, cfg.new_tokens)}
    save_drafter(drafter, target, out_dir)
    (out_dir / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    _plot(history, out_dir / "training.png")
    return summary


def _plot(history: list[dict], path: Path) -> None:
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
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
