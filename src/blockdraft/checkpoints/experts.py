"""Per-expert MoE tensors -> the stacked [E, ...] layout `layers/moe.py` runs.

Published MoE checkpoints (and transformers' `save_pretrained`) write one tensor per expert and
projection; the model holds one packed `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj`
[E, H, I]. Families whose experts are spelled otherwise convert them in their own file.
"""

from __future__ import annotations

import re

import torch

from ..config import TargetConfig
from ..errors import CheckpointError

_EXPERT = re.compile(r"^(layers\.\d+\.(?:mlp|feed_forward)\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)"
                     r"\.weight$")
EXPERT_PROJECTIONS = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))   # Qwen's spelling, LFM2's


def stack_experts(tensors: dict[str, torch.Tensor], num_experts: int) -> dict[str, torch.Tensor]:
    """`layers.N.mlp.experts.E.{gate,up,down}_proj.weight` (LFM2: `feed_forward.experts.E.{w1,w3,w2}`; one
    tensor per expert) -> the stacked [E, ...] tensors; every other tensor passes through."""
    per: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    out = {}
    for name, t in tensors.items():
        m = _EXPERT.match(name)
        if m is None:
            out[name] = t
        else:
            per.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = t
    for base, parts in per.items():
        gate, up, down = next(names for names in EXPERT_PROJECTIONS if set(parts) & set(names))
        for proj in (gate, up, down):
            have = parts.get(proj, {})
            missing = [e for e in range(num_experts) if e not in have]
            if missing:
                raise CheckpointError(f"target: missing tensors {base}.{missing[0]}.{proj}.weight "
                                      f"({len(missing)} of {num_experts} experts lack {proj})")
        stack = {p: torch.stack([parts[p][e] for e in range(num_experts)]) for p in parts}
        out[f"{base}.gate_up_proj"] = torch.cat([stack[gate], stack[up]], dim=1)
        out[f"{base}.down_proj"] = stack[down]
    return out


def stacked_experts(tensors: dict[str, torch.Tensor], cfg: TargetConfig,
                    skipped: dict[str, int]) -> dict[str, torch.Tensor]:
    """A family's tensor-name step when its checkpoint names are the model's own: the experts stacked
    where the target has MoE layers, everything else as it is."""
    return tensors if cfg.moe is None else stack_experts(tensors, cfg.moe.num_experts)
