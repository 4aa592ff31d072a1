"""Safetensors loading: single file or sharded index, name shims, meta-device models.

Models are built on the meta device and weights are assigned (`assign=True`),
so nothing is allocated twice. Missing files and tensors are `CheckpointError`s
that name the path or the tensor.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from ..errors import CheckpointError

log = logging.getLogger(__name__)


def read_json(path: Path, error: type[Exception] = CheckpointError) -> dict:
    if not path.is_file():
        raise error(f"missing file: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise error(f"{path} is not valid JSON: {e}") from None


def tensor_names(model_dir: Path) -> list[str]:
    """Tensor names of a HF directory without reading the tensors (index or file headers)."""
    from safetensors import safe_open

    names: list[str] = []
    for f in _safetensor_files(Path(model_dir)):
        with safe_open(str(f), "pt") as handle:
            names += list(handle.keys())
    return names


SAFETENSORS_FLOATS = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


def stored_dtype(model_dir: Path) -> str | None:
    """The floating dtype holding most of a HF directory's weights, from the file headers (None when
    there are no readable safetensors: loading then names what is missing)."""
    import math

    from safetensors import safe_open

    try:
        files = _safetensor_files(Path(model_dir))
    except CheckpointError:
        return None
    elements: dict[str, int] = {}
    for f in files:
        with safe_open(str(f), "pt") as handle:
            for name in handle.keys():
                piece = handle.get_slice(name)
                dtype = SAFETENSORS_FLOATS.get(piece.get_dtype())
                if dtype is not None:
                    elements[dtype] = elements.get(dtype, 0) + math.prod(piece.get_shape())
    return max(elements, key=elements.get) if elements else None


def _safetensor_files(model_dir: Path) -> list[Path]:
    if not model_dir.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {model_dir}")
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        files = [model_dir / s for s in shards]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors in {model_dir}")
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"missing shard listed in {index}: {f}")
    return files


def load_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF directory: `model.safetensors`, a sharded index, or any `*.safetensors`."""
    tensors: dict[str, torch.Tensor] = {}
    for f in _safetensor_files(Path(model_dir)):
        tensors.update(load_file(str(f)))
    return tensors


def assign_weights(model: nn.Module, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                   what: str, optional: tuple[str, ...] = ()) -> None:
    """Load `tensors` into a meta-device `model`; every parameter must be provided, shapes must match."""
    expected = model.state_dict(keep_vars=True)
    missing = [n for n in expected if n not in tensors and n not in optional]
    if missing:
        raise CheckpointError(f"{what}: missing tensors {missing[:6]}{' ...' if len(missing) > 6 else ''}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise CheckpointError(f"{what}: unexpected tensors {unexpected[:6]}"
                              f"{' ...' if len(unexpected) > 6 else ''} (config and weights disagree)")
    for name, param in expected.items():
        if name in tensors and tuple(tensors[name].shape) != tuple(param.shape):
            raise CheckpointError(f"{what}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                                  f"config implies {tuple(param.shape)}")
    model.load_state_dict({n: t.to(dtype) if t.is_floating_point() else t for n, t in tensors.items()},
                          strict=False, assign=True)


def strip_prefix(tensors: dict[str, torch.Tensor], prefix: str, what: str) -> dict[str, torch.Tensor]:
    """Shim: some exports nest every tensor under `prefix` (e.g. `model.`)."""
    if tensors and all(k.startswith(prefix) for k in tensors):
        log.info("%s: stripping %r prefix from tensor names", what, prefix)
        return {k[len(prefix):]: v for k, v in tensors.items()}
    return tensors
