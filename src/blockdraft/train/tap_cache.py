"""The teacher cache: one teacher-forced pass per committed sequence, stored for many drafter steps.

For every sequence of a teacher-data directory (`train/shards.py`) the target runs once, teacher
forced, and the cache keeps, per token position: the taps at the requested layers
(`layer_output`) and the target's post-norm final hidden state (a `hidden_states` drafter's last
tap), bf16, and the target's top-k next-token distribution (ids int32, probabilities float32).
Arrays are raw files read back as numpy memmaps, one folder per teacher shard, so a build resumes
shard by shard and a step touches only the rows it draws. `manifest.json` records what the cache
was built for (target, tap layers, top-k, dtype, the shards' sha256); `TapCache.open` checks it
against what the caller expects and names the first field that differs. This module knows
nothing about drafters or losses.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import Taps
from ..errors import BlockdraftError
from .shards import read_manifest, read_shard

FORMAT = "blockdraft-tapcache-v1"
MANIFEST = "manifest.json"


class TapCacheError(BlockdraftError):
    """A teacher cache is missing, incomplete or was built for something else."""


@dataclass(frozen=True)
class CacheSpec:
    """What a cache holds: checked field by field on open."""
    target: dict                      # identity of the target (name, weights digest, dtype, ...)
    tap_layers: tuple[int, ...]       # taps at `layer_output`, in this order; the final hidden follows them
    top_k: int                        # next-token distribution kept per position
    hidden_size: int
    vocab_size: int
    dtype: str = "bfloat16"           # taps and final hidden
    shards: tuple[tuple[str, str], ...] = ()   # (teacher shard file, sha256), in manifest order

    def __post_init__(self):
        if self.top_k < 1 or self.top_k > self.vocab_size:
            raise ValueError(f"CacheSpec.top_k must be in [1, vocab_size={self.vocab_size}], got {self.top_k}")
        if not self.tap_layers:
            raise ValueError("CacheSpec.tap_layers must name at least one layer")
        if self.dtype != "bfloat16":
            raise ValueError(f"CacheSpec.dtype must be 'bfloat16', got {self.dtype!r}")

    def to_json(self) -> dict:
        d = asdict(self)
        d["tap_layers"] = list(self.tap_layers)
        d["shards"] = [list(s) for s in self.shards]
        return d

    @property
    def width(self) -> int:
        """Columns of a stored row: every tap, then the final hidden."""
        return (len(self.tap_layers) + 1) * self.hidden_size


@dataclass
class CachedSeq:
    """One sequence's rows, as views of the memmaps (torch tensors sharing their memory)."""
    ids: torch.Tensor            # [L] int64 prompt + response
    hidden: torch.Tensor         # [L, (taps + 1) * H] bf16: taps at layer_output, then the final hidden
    topk_ids: torch.Tensor       # [L, k] int32: row t = the target's k likeliest ids for position t + 1
    topk_probs: torch.Tensor     # [L, k] float32, their probabilities (the rest of the mass is 1 - sum)
    response_start: int

    @property
    def anchor_range(self) -> tuple[int, int]:
        """[lo, hi): anchors whose first predicted position is a response token."""
        return max(1, self.response_start - 1), len(self.ids) - 1


def spec_for(target, teacher_dir: str | Path, tap_layers, top_k: int, target_id: dict) -> CacheSpec:
    manifest = read_manifest(teacher_dir)
    return CacheSpec(dict(target_id), tuple(int(i) for i in tap_layers), int(top_k), target.config.hidden_size,
                     target.config.vocab_size, shards=tuple((s["file"], s["sha256"]) for s in manifest["shards"]))


def _shard_dir(root: Path, file: str) -> Path:
    return root / Path(file).stem


@torch.no_grad()
def teacher_rows(target, ids: torch.Tensor, spec: CacheSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One teacher-forced pass over ids [L] -> hidden [L, width] bf16, top-k ids [L, k], probs [L, k].

    The taps come out of the runtime's own forward (bit-equal to prefill + verify in bf16); the
    distribution is softmax(lm_head(final)) in float32 over logits from one bf16 GEMM (within bf16
    rounding of the runtime's row-chunked head), capped where the target caps them."""
    out = target(ids[None], tap_layers=Taps(spec.tap_layers, "layer_output"),
                 logits_at=torch.zeros(1, dtype=torch.long))
    final = out.hidden[0]                                                        # [L, H]
    hidden = torch.cat([out.taps[0], final], dim=-1).to(torch.bfloat16)          # [L, width]
    logits = torch.nn.functional.linear(final.to(target.lm_head.weight.dtype), target.lm_head.weight).float()
    cap = target.config.final_logit_softcapping
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    probs, top = torch.softmax(logits, dim=-1).topk(spec.top_k, dim=-1)          # [L, k]
    return hidden, top.to(torch.int32), probs


def build(target, teacher_dir: str | Path, cache_dir: str | Path, spec: CacheSpec, progress: bool = False) -> Path:
    """Fill `cache_dir` for every shard of `teacher_dir` not built yet (resumable by shard): the
    manifest is written first, each shard's `done.json` last."""
    teacher_dir, root = Path(teacher_dir), Path(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    if (root / MANIFEST).is_file():
        _check(root, spec, building=True)
    _write_json(root / MANIFEST, {"format": FORMAT, **spec.to_json()})
    infos = {s["file"]: s for s in read_manifest(teacher_dir)["shards"]}
    from tqdm import tqdm

    for file in tqdm(balanced_order([f for f, _ in spec.shards], infos), desc="teacher cache", unit="shard",
                     disable=not progress):
        out = _shard_dir(root, file)
        if (out / "done.json").is_file():
            continue
        convs = read_shard(teacher_dir, infos[file])
        lengths = np.array([len(c.prompt) + len(c.response) for c in convs], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        total = int(lengths.sum())
        out.mkdir(parents=True, exist_ok=True)
        tokens = np.concatenate([np.asarray(c.prompt + c.response, dtype=np.int32) for c in convs])
        hidden = np.lib.format.open_memmap(out / "hidden.npy", "w+", np.uint16, (total, spec.width))
        top_ids = np.lib.format.open_memmap(out / "topk_ids.npy", "w+", np.int32, (total, spec.top_k))
        top_probs = np.lib.format.open_memmap(out / "topk_probs.npy", "w+", np.float32, (total, spec.top_k))
        for at, n, conv in zip(starts.tolist(), lengths.tolist(), convs):
            h, i, p = teacher_rows(target, torch.as_tensor(conv.prompt + conv.response), spec)
            hidden[at:at + n] = h.view(torch.uint16).numpy()        # bf16 bits
            top_ids[at:at + n], top_probs[at:at + n] = i.numpy(), p.numpy()
        for arr in (hidden, top_ids, top_probs):
            arr.flush()
        np.save(out / "tokens.npy", tokens)
        np.save(out / "seqs.npy", np.stack([starts, lengths, [len(c.prompt) for c in convs]], axis=1))
        _write_json(out / "done.json", {"file": file, "sequences": len(convs), "tokens": total})
    return root


def balanced_order(files: list[str], infos: dict) -> list[str]:
    """Build order: the first shard of every source, then the second of each, ... so a cache that
    is still being built already covers every source."""
    rank, seen = {}, {}
    for f in files:
        src = infos[f]["source"]
        rank[f], seen[src] = seen.get(src, 0), seen.get(src, 0) + 1
    return sorted(files, key=lambda f: (rank[f], files.index(f)))


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _check(root: Path, spec: CacheSpec, building: bool = False) -> None:
    """Compare the stored manifest with `spec`, naming the first field that differs. Opening, every
    shard of `spec` must be cached with the same sha256; building, the cache may hold fewer."""
    path = root / MANIFEST
    try:
        stored = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TapCacheError(f"{path}: unreadable teacher-cache manifest ({e})") from None
    if stored.get("format") != FORMAT:
        raise TapCacheError(f"{path}: format {stored.get('format')!r}, expected {FORMAT!r}")
    want = spec.to_json()
    for field, value in want.items():
        if field != "shards" and stored.get(field) != value:
            raise TapCacheError(f"{path}: field {field!r} is {stored.get(field)!r}, expected {value!r}; rebuild "
                                f"the cache (delete {root}) for this target and these taps")
    have = {f: sha for f, sha in stored.get("shards") or []}
    for file, sha in spec.shards:
        if file not in have:
            if building:
                continue
            raise TapCacheError(f"{path}: field 'shards' lacks {file}; build the cache from this teacher data")
        if have[file] != sha:
            raise TapCacheError(f"{path}: field 'shards': {file} has sha256 {have[file][:12]}… in the cache, "
                                f"{sha[:12]}… in the teacher data; rebuild the cache (delete {root})")


class TapCache:
    """The built cache as memmaps: `seq(i)` gives the i-th sequence over every shard, in manifest order."""

    def __init__(self, root: Path, spec: CacheSpec):
        self.root, self.spec = Path(root), spec
        self._shards, rows = [], []
        for n, (file, _) in enumerate(spec.shards):
            d = _shard_dir(self.root, file)
            if not (d / "done.json").is_file():
                raise TapCacheError(f"{self.root}: shard {file} is not built yet (no done.json); run the build "
                                    "again to finish it")
            arrays = {name: np.load(d / f"{name}.npy", mmap_mode="r")
                      for name in ("tokens", "seqs", "hidden", "topk_ids", "topk_probs")}
            if arrays["hidden"].shape[1] != spec.width:
                raise TapCacheError(f"{d / 'hidden.npy'}: {arrays['hidden'].shape[1]} columns, expected {spec.width}")
            self._shards.append(arrays)
            rows += [(n, j) for j in range(len(arrays["seqs"]))]
        self._rows = rows

    @classmethod
    def open(cls, root: str | Path, spec: CacheSpec) -> TapCache:
        root = Path(root)
        if not (root / MANIFEST).is_file():
            raise TapCacheError(f"{root}: no teacher cache here ({MANIFEST} missing); build it first")
        _check(root, spec)
        return cls(root, spec)

    def __len__(self) -> int:
        return len(self._rows)

    def seq(self, i: int) -> CachedSeq:
        shard, j = self._rows[i]
        a = self._shards[shard]
        start, n, prompt = (int(x) for x in a["seqs"][j])
        rows = slice(start, start + n)
        return CachedSeq(torch.from_numpy(a["tokens"][rows].astype(np.int64)),
                         torch.from_numpy(np.array(a["hidden"][rows])).view(torch.bfloat16),
                         torch.from_numpy(np.array(a["topk_ids"][rows])),
                         torch.from_numpy(np.array(a["topk_probs"][rows])), prompt)

    def taps_for(self, seq: CachedSeq, layers: tuple[int, ...], tap_point: str, last_layer: int) -> torch.Tensor:
        """[1, L, F] a drafter's packed taps: `layer_output` rows, or for a `hidden_states` drafter
        the final hidden in place of its last-layer tap."""
        h = self.spec.hidden_size
        parts = []
        for layer in layers:
            if layer == last_layer and tap_point == "hidden_states":
                parts.append(seq.hidden[:, -h:])
            elif layer in self.spec.tap_layers:
                k = self.spec.tap_layers.index(layer)
                parts.append(seq.hidden[:, k * h:(k + 1) * h])
            else:
                raise TapCacheError(f"{self.root}: tap layer {layer} is not cached (cached: {list(self.spec.tap_layers)})")
        return torch.cat(parts, dim=-1)[None]
