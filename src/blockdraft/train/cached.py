"""Drafter steps drawn from the teacher cache: the target ran once per sequence, the drafters train
many times on what it stored (`tap_cache.TapCache`).

A step draws `seqs_per_step` sequences (seeded per-epoch permutations) and, in each, every
response position as an anchor (or `blocks_per_seq` of them, seeded by step), so one step
trains hundreds to thousands of blocks. Blocks go through the runtime's attention path
(`losses.blocks_at`); the losses read the target's cached top-k distribution. Compute runs
under bf16 autocast over fp32 master weights where asked. Draws depend only on (seed, step),
so a run resumed from its state file continues bit for bit. This module knows nothing about
evaluation or publishing: `on_checkpoint` is where a caller hooks them.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..drafters.registry import training_of
from ..models.drafter import BlockDrafter
from .losses import blocks_at, with_topk
from .tap_cache import CachedSeq, TapCache

SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class CachedTrainConfig:
    steps: int                        # the run's length (the cosine schedule decays over it)
    lr: float = 1e-3
    warmup: int = 50                  # linear warmup steps
    schedule: str = "constant"        # after warmup: "constant", or "cosine" down to min_lr_ratio × lr
    min_lr_ratio: float = 0.1
    seqs_per_step: int = 4
    blocks_per_seq: int = 0           # anchors per drawn sequence; 0 = every response position
    seed: int = 0
    position_gamma: float = 4.0       # loss weight of draft slot k: exp(-k / gamma)
    bf16: bool = True                 # bf16 autocast over fp32 master weights
    grad_clip: float = 1.0
    save_every_seconds: float = 600   # checkpoint at least this often

    def __post_init__(self):
        for name in ("steps", "seqs_per_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"CachedTrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.blocks_per_seq < 0:
            raise ValueError(f"CachedTrainConfig.blocks_per_seq must be >= 0 (0: every position), got {self.blocks_per_seq}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"CachedTrainConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not self.lr > 0 or self.warmup < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"CachedTrainConfig: lr > 0, warmup >= 0, 0 <= min_lr_ratio <= 1 "
                             f"(got lr={self.lr}, warmup={self.warmup}, min_lr_ratio={self.min_lr_ratio})")
        if not self.save_every_seconds > 0:
            raise ValueError(f"CachedTrainConfig.save_every_seconds must be > 0, got {self.save_every_seconds}")


def lr_scale(step: int, cfg: CachedTrainConfig) -> float:
    """Multiplier of cfg.lr at `step` (0-based): linear warmup, then constant or cosine."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return 1.0
    done = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done))


@functools.lru_cache(maxsize=2)
def _epoch_order(n: int, epoch: int, seed: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()


def drawn(n: int, step: int, cfg: CachedTrainConfig) -> list[int]:
    """The sequences step `step` trains on: consecutive draws from seeded per-epoch permutations."""
    out = []
    for j in range(cfg.seqs_per_step):
        epoch, pos = divmod(step * cfg.seqs_per_step + j, n)
        out.append(_epoch_order(n, epoch, cfg.seed)[pos])
    return out


def anchors_for(seq: CachedSeq, step: int, j: int, cfg: CachedTrainConfig) -> torch.Tensor:
    """[M] anchors of the j-th sequence of step `step`: every response position, or a seeded subset."""
    lo, hi = seq.anchor_range
    every = torch.arange(lo, hi)
    if cfg.blocks_per_seq == 0 or cfg.blocks_per_seq >= len(every):
        return every
    g = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 64 + j)
    return every[torch.randperm(len(every), generator=g)[:cfg.blocks_per_seq]].sort().values


@dataclass
class RunState:
    step: int
    elapsed: float                   # seconds of training before this process
    history: dict[str, list[dict]]


def _save(path: Path, drafters, optims, state: RunState, cfg: CachedTrainConfig) -> None:
    tmp = path.with_suffix(".partial")
    torch.save({"models": {n: d.state_dict() for n, d in drafters.items()},
                "optims": {n: o.state_dict() for n, o in optims.items()}, "step": state.step,
                "elapsed": state.elapsed, "history": state.history, "config": asdict(cfg)}, tmp)
    os.replace(tmp, path)           # an interruption mid-write leaves the previous state whole


def _load(path: Path, drafters, optims, cfg: CachedTrainConfig) -> RunState:
    saved = torch.load(path, weights_only=False)
    if saved["config"] != asdict(cfg):
        diff = next(k for k, v in asdict(cfg).items() if saved["config"].get(k) != v)
        raise ValueError(f"{path}: a run with {diff}={saved['config'].get(diff)!r} is stored here, "
                         f"not {diff}={getattr(cfg, diff)!r}; resume it as it was or start elsewhere")
    if set(saved["models"]) != set(drafters):
        raise ValueError(f"{path}: the stored run trains {sorted(saved['models'])}, not {sorted(drafters)}")
    for name, d in drafters.items():
        d.load_state_dict(saved["models"][name])
        optims[name].load_state_dict(saved["optims"][name])
    return RunState(saved["step"], saved["elapsed"], saved["history"])


def step_losses(drafter: BlockDrafter, cache: TapCache, seqs: list[tuple[CachedSeq, torch.Tensor]],
                cfg: CachedTrainConfig, last_layer: int) -> dict[str, float]:
    """Forward + backward of one drafter over the drawn sequences (gradients accumulate; each
    sequence weighs by its share of the step's blocks). Returns the step's mean loss parts."""
    c = drafter.config
    training = training_of(c.kind)
    total = sum(len(a) for _, a in seqs)
    parts_sum: dict[str, float] = {}
    for seq, anchors in seqs:
        taps = cache.taps_for(seq, c.target_layer_ids, c.tap_point, last_layer)            # [1, L, F] bf16
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            block = blocks_at(drafter, taps, None, seq.ids, anchors)
            if training.distills:                   # the target's distribution: the cache's top-k
                block = with_topk(block, anchors, len(seq.ids), seq.topk_ids, seq.topk_probs)
            parts = training.loss(drafter, block, gamma=cfg.position_gamma)
        share = len(anchors) / total
        (parts["loss"] * share).backward()
        for k, v in parts.items():
            parts_sum[k] = parts_sum.get(k, 0.0) + float(v.detach()) * share
    return parts_sum


def fit_cached(drafters: dict[str, BlockDrafter], cache: TapCache, cfg: CachedTrainConfig, state_path: Path,
               last_layer: int, stop_at: int | None = None, deadline: float | None = None,
               on_checkpoint=None, log=None) -> RunState:
    """Train `drafters` on the same draws (same sequences and anchors each step), resuming from
    `state_path` if it exists. Checkpoints at least every `cfg.save_every_seconds`, at `stop_at`
    (a step), after `deadline` (time.time()) and at the end; `on_checkpoint(step, drafters, state)`
    runs after each (snapshots, evaluation: its time is not counted as training)."""
    optims = {}
    for name, d in drafters.items():
        d.float().train().requires_grad_(True)
        optims[name] = torch.optim.AdamW(list(d.parameters()), lr=cfg.lr, weight_decay=0.0)
    state = _load(state_path, drafters, optims, cfg) if state_path.is_file() else RunState(0, 0.0, {n: [] for n in drafters})
    end = min(cfg.steps, stop_at) if stop_at is not None else cfg.steps
    t_start, t_saved = time.perf_counter(), time.perf_counter()
    base = state.elapsed
    while state.step < end:
        step = state.step
        seqs = [cache.seq(i) for i in drawn(len(cache), step, cfg)]
        seqs = [(s, anchors_for(s, step, j, cfg)) for j, s in enumerate(seqs)]
        seqs = [(s, a) for s, a in seqs if len(a)]
        blocks = sum(len(a) for _, a in seqs)
        for name, d in drafters.items():
            opt = optims[name]
            for group in opt.param_groups:
                group["lr"] = cfg.lr * lr_scale(step, cfg)
            opt.zero_grad(set_to_none=True)
            parts = step_losses(d, cache, seqs, cfg, last_layer) if seqs else {}
            torch.nn.utils.clip_grad_norm_(list(d.parameters()), cfg.grad_clip)
            opt.step()
            state.history[name].append({"step": step + 1, "blocks": blocks, **parts})
        state.step += 1
        now = time.perf_counter()
        state.elapsed = base + now - t_start
        if log is not None:
            log(state)
        if (now - t_saved >= cfg.save_every_seconds or state.step == end
                or (deadline is not None and time.time() >= deadline)):
            _save(state_path, drafters, optims, state, cfg)
            if on_checkpoint is not None:
                paused = time.perf_counter()
                on_checkpoint(state.step, drafters, state)
                for d in drafters.values():
                    d.train().requires_grad_(True)
                t_start += time.perf_counter() - paused          # evaluation is not training time
            t_saved = time.perf_counter()
            if deadline is not None and time.time() >= deadline:
                break
    for d in drafters.values():
        d.eval().requires_grad_(False)
    return state
