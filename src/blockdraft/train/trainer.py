"""The per-step teacher recipe: distil a drafter from its target's own greedy text, resumably
(`scripts/train_default_drafters.py` trained the shipped SmolLM2 drafters with it; `blockdraft
train` runs the cached-teacher recipe, `run.py`, and shares the teacher helpers below).

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

import functools
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..checkpoints.publish import save_drafter
from ..config import Taps
from ..drafters.registry import training_of
from ..engine.engine import sized_engine
from ..errors import RequestError
from ..models.drafter import BlockDrafter
from ..models.target import TargetModel
from ..sampling.params import SamplingParams
from .losses import blocks_at


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200
    lr: float = 3e-3
    warmup: int = 10                  # linear warmup steps, then cosine decay to 10% of lr
    seqs_per_step: int = 2
    anchors_per_seq: int = 8
    seed: int = 0
    first_draw: int = 0               # index of the first sequence drawn: a run continued from trained
                                      # weights starts after the draws they saw, so it meets new data
    save_every: int = 50              # checkpoint every N steps ...
    save_every_seconds: float = 600   # ... and at least this often (an interrupted run loses little)
    new_tokens: int = 64
    position_gamma: float = 4.0       # loss weight of draft slot k: exp(-k / gamma) (inf: every slot alike)


@dataclass
class TeacherSeq:
    ids: torch.Tensor                  # [L] prompt + the target's response
    taps: torch.Tensor | None          # [1, L, F] the drafter's tap layers, packed (None: recomputed per step)
    final: torch.Tensor | None         # [L, H] the target's post-norm last hidden (logits = lm_head(final), capped
                                       # where the target caps them)
    response_start: int                # first response position; anchors start one before it

    @property
    def anchor_range(self) -> tuple[int, int]:
        """[lo, hi): anchors whose first predicted position is a response token."""
        return max(1, self.response_start - 1), len(self.ids) - 1


def teacher_responses(target: TargetModel, prompts: list[list[int]], new_tokens: int,
                      eos_ids: frozenset[int] = frozenset(), max_batch: int = 32,
                      progress: bool = False) -> list[list[int]]:
    """The target's greedy continuation of each prompt (stopping at `eos_ids`), by the batch engine."""
    engine = sized_engine(target, None, max_batch, max(len(p) for p in prompts) + new_tokens, eos_ids)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=not eos_ids)
    from tqdm import tqdm

    bar = tqdm(total=len(prompts), desc="teacher responses", unit="seq", disable=not progress)
    out = []
    for i in range(0, len(prompts), max_batch):
        chunk = prompts[i:i + max_batch]
        out += [o.token_ids for o in engine.generate(chunk, params)]
        bar.update(len(chunk))
    bar.close()
    return out


@torch.no_grad()
def teacher_force(target: TargetModel, seqs: list[TeacherSeq], taps: Taps | tuple[int, ...]) -> list[TeacherSeq]:
    """One teacher-forced pass over `seqs` (right-padded; causal attention keeps the real rows exact and
    the row-invariant kernels make each row what the runtime computes): copies with taps and final."""
    taps = taps if isinstance(taps, Taps) else Taps(tuple(taps))
    longest = max(len(s.ids) for s in seqs)
    ids = torch.zeros(len(seqs), longest, dtype=torch.long, device=target.embed_tokens.weight.device)
    for row, s in enumerate(seqs):
        ids[row, :len(s.ids)] = s.ids
    out = target(ids, tap_layers=taps, logits_at=torch.zeros(len(seqs), dtype=torch.long, device=ids.device))
    return [TeacherSeq(s.ids, out.taps[row:row + 1, :len(s.ids)].clone(), out.hidden[row, :len(s.ids)].clone(),
                       s.response_start) for row, s in enumerate(seqs)]


def teacher_data(target: TargetModel, prompts: list[list[int]], new_tokens: int, taps: Taps | tuple[int, ...],
                 eos_ids: frozenset[int] = frozenset(), max_batch: int = 32, progress: bool = False,
                 responses: list[list[int]] | None = None) -> list[TeacherSeq]:
    """Each prompt + the target's greedy response (stopping at `eos_ids`; `responses`: made already), with
    taps (read at the drafter's tap point) and the target's final hidden state, held in memory (small data)."""
    if responses is None:
        responses = teacher_responses(target, prompts, new_tokens, eos_ids, max_batch, progress)
    seqs = [TeacherSeq(torch.tensor(p + r), None, None, len(p)) for p, r in zip(prompts, responses)]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids))
    data: list[TeacherSeq | None] = [None] * len(seqs)
    for i in range(0, len(order), 16):
        group = order[i:i + 16]
        for j, seq in zip(group, teacher_force(target, [seqs[j] for j in group], taps)):
            data[j] = seq
    return data


def acceptance_lengths(target: TargetModel, drafter: BlockDrafter, prompts: list[list[int]], new_tokens: int,
                       max_batch: int = 8) -> list[list[int]]:
    """Greedy acceptance lengths per prompt at the drafter's full width, through the batch engine
    (no EOS stop, so every prompt decodes `new_tokens`)."""
    engine = sized_engine(target, drafter, min(max_batch, len(prompts)),
                          max(len(p) for p in prompts) + new_tokens + 1, frozenset(), adaptive_speculation=False)
    return [o.acceptance_lengths for o in engine.generate(prompts, SamplingParams(max_tokens=new_tokens))]


def mean_acceptance(target: TargetModel, drafter: BlockDrafter, prompts: list[list[int]], new_tokens: int) -> float:
    lengths = [a for per_prompt in acceptance_lengths(target, drafter, prompts, new_tokens) for a in per_prompt]
    return sum(lengths) / max(1, len(lengths))


def _lr_scale(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    done = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))


def _joint_taps(drafters: dict[str, BlockDrafter], target: TargetModel) -> Taps:
    """One teacher-forced pass serves every drafter: the union of their layers at `layer_output`
    (a `hidden_states` drafter's last-layer tap is the final norm of it, i.e. `final`)."""
    layers = sorted({i for d in drafters.values() for i in d.config.target_layer_ids})
    return Taps(tuple(layers), "layer_output")


def _taps_for(drafter: BlockDrafter, seq: TeacherSeq, joint: Taps, last_layer: int) -> torch.Tensor:
    """[1, L, F] this drafter's packed taps out of a joint pass (`seq.taps` at `joint`)."""
    width = seq.final.shape[-1]
    parts = []
    for layer in drafter.config.target_layer_ids:
        if layer == last_layer and drafter.config.tap_point == "hidden_states":
            parts.append(seq.final[None])
        else:
            k = joint.layers.index(layer)
            parts.append(seq.taps[..., k * width:(k + 1) * width])
    return torch.cat(parts, dim=-1)


def drawn_sequences(n: int, step: int, cfg: TrainConfig) -> list[int]:
    """Which of the n sequences step `step` trains on (from `cfg.first_draw` on in the seeded order)."""
    first = cfg.first_draw + step * cfg.seqs_per_step
    return [_sequence_order(n, first + j, cfg.seed) for j in range(cfg.seqs_per_step)]


def _sequence_order(n: int, index: int, seed: int) -> int:
    """The `index`-th sequence drawn: epochs are seeded permutations, so a resumed run draws the same."""
    epoch, pos = divmod(index, n)
    return _epoch_order(n, epoch, seed)[pos]


@functools.lru_cache(maxsize=2)
def _epoch_order(n: int, epoch: int, seed: int) -> list[int]:
    """One epoch's seeded permutation of n sequences (made once per epoch, not per draw)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()


def fit(drafter: BlockDrafter, data: list[TeacherSeq], cfg: TrainConfig, state_path: Path | None = None,
        progress: bool = True, head: torch.nn.Linear | None = None, target: TargetModel | None = None) -> list[dict]:
    """The optimisation loop over teacher data for one drafter (see `fit_jointly`)."""
    return fit_jointly({drafter.config.kind: drafter}, data, cfg, state_path, progress, head, target)[
        drafter.config.kind]


def fit_jointly(drafters: dict[str, BlockDrafter], data: list[TeacherSeq], cfg: TrainConfig,
                state_path: Path | None = None, progress: bool = True, head: torch.nn.Linear | None = None,
                target: TargetModel | None = None, on_checkpoint=None) -> dict[str, list[dict]]:
    """Train several drafters on the same batches (same sequences, same anchors, one teacher-forced
    pass each step); resumes from / checkpoints to `state_path` every `save_every` steps and at least
    every `save_every_seconds`. Sequences without taps are teacher-forced by `target` when drawn.

    `head` is the target's LM head (DSpark's loss needs the target distribution).
    `on_checkpoint(step, drafters)` runs after each checkpoint (e.g. to write a snapshot).
    """
    usable = [d for d in data if d.anchor_range[1] > d.anchor_range[0]]
    if not usable:
        longest = max((len(d.ids) for d in data), default=0)
        raise RequestError(f"none of the {len(data)} teacher sequences has a response token to predict "
                           f"(longest {longest} tokens); use longer prompts/responses (--new-tokens) or more prompts")
    data = usable
    if target is None and any(d.taps is None for d in data):
        raise RequestError("teacher sequences without taps need the target to recompute them")
    if len(drafters) > 1 and any(d.taps is not None for d in data):
        raise RequestError("joint training recomputes taps per step; pass sequences without taps")
    optims = {}
    for name, drafter in drafters.items():
        for p in drafter.parameters():
            p.requires_grad_(True)
        optims[name] = torch.optim.AdamW(list(drafter.parameters()), lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed + cfg.first_draw)   # new anchors for a continued run too
    history: dict[str, list[dict]] = {name: [] for name in drafters}
    start, elapsed = 0, 0.0
    if state_path is not None and state_path.is_file():  # resume exactly where we stopped
        state = torch.load(state_path, weights_only=False)
        for name, drafter in drafters.items():
            drafter.load_state_dict(state["models"][name])
            optims[name].load_state_dict(state["optims"][name])
        gen.set_state(state["rng"])
        history, start, elapsed = state["history"], state["step"], state.get("elapsed", 0.0)
    if head is None and target is not None:
        head = target.lm_head
    joint = _joint_taps(drafters, target) if target is not None else None
    last_layer = target.config.num_layers - 1 if target is not None else -1
    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=start, desc=f"training {'+'.join(drafters)}", unit="step",
               disable=not progress)
    for drafter in drafters.values():
        drafter.train()
    t_saved = time.perf_counter()
    t_run = t_saved - elapsed
    for step in range(start, cfg.steps):
        picked = [data[i] for i in drawn_sequences(len(data), step, cfg)]
        missing = [s for s in picked if s.taps is None]
        if missing:     # one pass per sequence: a padded pair spent 29% of its rows on padding (one measured)
            forced = iter([teacher_force(target, [s], joint)[0] for s in missing])
            picked = [next(forced) if s.taps is None else s for s in picked]
        anchors = []
        for seq in picked:
            lo, hi = seq.anchor_range
            anchors.append(lo + torch.randperm(hi - lo, generator=gen)[:cfg.anchors_per_seq])
        for name, drafter in drafters.items():
            opt = optims[name]
            for group in opt.param_groups:
                group["lr"] = cfg.lr * _lr_scale(step, cfg)
            opt.zero_grad()
            training = training_of(drafter.config.kind)
            totals: dict[str, float] = {}
            for seq, where in zip(picked, anchors):
                taps = seq.taps if not missing else _taps_for(drafter, seq, joint, last_layer)
                block = blocks_at(drafter, taps, seq.final, seq.ids, where,
                                  (head or drafter.shared.lm_head) if training.distills else None)
                parts = training.loss(drafter, block, gamma=cfg.position_gamma)
                (parts["loss"] / cfg.seqs_per_step).backward()
                for k, v in parts.items():
                    totals[k] = totals.get(k, 0.0) + float(v.detach()) / cfg.seqs_per_step
            torch.nn.utils.clip_grad_norm_(list(drafter.parameters()), 1.0)
            opt.step()
            history[name].append({"step": step + 1, **totals})
        bar.update(1)
        bar.set_postfix({f"{n}": f"{h[-1].get('loss', 0):.3f}" for n, h in history.items()})
        now = time.perf_counter()
        due = (step + 1) % cfg.save_every == 0 or now - t_saved >= cfg.save_every_seconds or step + 1 == cfg.steps
        if state_path is not None and due:
            torch.save({"models": {n: d.state_dict() for n, d in drafters.items()},
                        "optims": {n: o.state_dict() for n, o in optims.items()}, "rng": gen.get_state(),
                        "history": history, "step": step + 1, "elapsed": now - t_run}, state_path)
            t_saved = now
            if on_checkpoint is not None:
                on_checkpoint(step + 1, drafters)
                for drafter in drafters.values():
                    drafter.train()
    bar.close()
    for drafter in drafters.values():
        drafter.eval().requires_grad_(False)
    return history


def train(drafter: BlockDrafter, target: TargetModel, prompts: list[list[int]], eval_prompts: list[list[int]],
          cfg: TrainConfig, out_dir: Path, progress: bool = True, eos_ids: frozenset[int] = frozenset(),
          data: list[TeacherSeq] | None = None, responses: list[list[int]] | None = None) -> dict:
    """Teacher data (from `responses` to `prompts` when given) → `fit` (resumable) → published
    checkpoint, training.json, plot."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if data is None:
        data = teacher_data(target, prompts, cfg.new_tokens, drafter.config.taps, eos_ids,
                            progress=progress, responses=responses)
    t0 = time.perf_counter()
    history = fit(drafter, data, cfg, out_dir / "trainer_state.pt", progress, target.lm_head, target)
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
