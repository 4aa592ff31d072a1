"""Teacher data on disk: compressed shards of token ids and a manifest, appendable.

A data directory holds `manifest.json` and `*.npz` shards. Each shard is one source's
conversations: `tokens` (uint16/uint32, prompt then response, concatenated),
`prompt_lens` and `response_lens` (int32 [n]). The manifest records, per shard, its
source, licence, count, token totals and sha256, and once for the directory the
target and numerics that produced the responses. New shards are appended without
touching old ones; taps are never stored (they are recomputed by teacher forcing).
Everything is checked on load: a missing, truncated or altered shard is a named
`DataError`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..errors import BlockdraftError

MANIFEST = "manifest.json"
FORMAT = "blockdraft-teacher-v1"


class DataError(BlockdraftError):
    """A teacher-data shard or manifest is missing, corrupt or inconsistent."""


@dataclass(frozen=True)
class ShardInfo:
    file: str
    source: str
    licence: str
    count: int
    prompt_tokens: int
    response_tokens: int
    sha256: str


@dataclass(frozen=True)
class Conversation:
    prompt: list[int]      # chat-templated prompt ids (ends with the assistant header)
    response: list[int]    # the target's greedy response (EOS included when it stopped)


def read_manifest(root: str | Path) -> dict:
    path = Path(root) / MANIFEST
    if not path.is_file():
        return {"format": FORMAT, "target": None, "shards": []}
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e})") from None
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def _write_manifest(root: Path, manifest: dict) -> None:
    tmp = root / (MANIFEST + ".partial")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, root / MANIFEST)


def write_shard(root: str | Path, name: str, source: str, licence: str, conversations: list[Conversation],
                target: dict) -> ShardInfo:
    """Write `name`.npz and append it to the manifest (whose `target` must match, if set)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(root)
    if manifest["target"] is not None and manifest["target"] != target:
        raise DataError(f"{root}: shards were made by {manifest['target']}, not {target}")
    if any(s["file"] == f"{name}.npz" for s in manifest["shards"]):
        raise DataError(f"{root}: shard {name}.npz is already in the manifest")
    flat = [t for c in conversations for t in c.prompt + c.response]
    dtype = np.uint16 if max(flat, default=0) < 2 ** 16 else np.uint32
    buf = io.BytesIO()
    np.savez_compressed(buf, tokens=np.asarray(flat, dtype=dtype),
                        prompt_lens=np.asarray([len(c.prompt) for c in conversations], dtype=np.int32),
                        response_lens=np.asarray([len(c.response) for c in conversations], dtype=np.int32))
    data = buf.getvalue()
    (root / f"{name}.npz").write_bytes(data)
    info = ShardInfo(f"{name}.npz", source, licence, len(conversations),
                     sum(len(c.prompt) for c in conversations), sum(len(c.response) for c in conversations),
                     hashlib.sha256(data).hexdigest())
    manifest["target"] = target
    manifest["shards"].append(asdict(info))
    _write_manifest(root, manifest)
    return info


def read_shard(root: str | Path, info: dict) -> list[Conversation]:
    path = Path(root) / info["file"]
    if not path.is_file():
        raise DataError(f"missing shard {path} (listed in {MANIFEST})")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != info["sha256"]:
        raise DataError(f"{path}: sha256 {digest[:12]}… != manifest {info['sha256'][:12]}… (corrupt or truncated)")
    try:
        with np.load(io.BytesIO(data)) as z:
            tokens, plens, rlens = z["tokens"], z["prompt_lens"], z["response_lens"]
    except Exception as e:  # noqa: BLE001 - any unreadable archive is the same user-facing error
        raise DataError(f"{path}: unreadable shard ({type(e).__name__}: {e})") from None
    if len(plens) != info["count"] or len(rlens) != info["count"]:
        raise DataError(f"{path}: {len(plens)} prompts / {len(rlens)} responses, manifest count {info['count']}")
    if int(plens.sum()) + int(rlens.sum()) != len(tokens):
        raise DataError(f"{path}: lengths sum to {int(plens.sum()) + int(rlens.sum())} tokens, "
                        f"the shard holds {len(tokens)}")
    out, at = [], 0
    ids = tokens.astype(np.int64).tolist()
    for p, r in zip(plens.tolist(), rlens.tolist()):
        out.append(Conversation(ids[at:at + p], ids[at + p:at + p + r]))
        at += p + r
    return out


def load_conversations(root: str | Path, vocab_size: int | None = None) -> list[Conversation]:
    """Every conversation in the directory, in manifest order, each shard checked."""
    manifest = read_manifest(root)
    if not manifest["shards"]:
        raise DataError(f"{Path(root) / MANIFEST}: no shards")
    out = []
    for info in manifest["shards"]:
        convs = read_shard(root, info)
        if vocab_size is not None:
            bad = max((max(c.prompt + c.response) for c in convs), default=0)
            if bad >= vocab_size:
                raise DataError(f"{Path(root) / info['file']}: token id {bad} outside the vocabulary [0, {vocab_size})")
        out += convs
    return out
