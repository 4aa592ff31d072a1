"""The one table from a Hugging Face architecture name or `model_type` to the target family that owns it.

A checkpoint's `architectures` entries are looked up first (the first one a family owns), then its
`model_type`; where both name a family they must agree. Every other module asks this table, or the
family record it returns, instead of testing an architecture string. A new family is one file under
`families/` and one `register` call (or one entry in `FAMILIES`).
"""

from __future__ import annotations

from typing import Callable

from ..errors import ConfigError
from .family import Family, GgufSpelling
from .families import gemma4, gpt_oss, lfm2, llama, qwen3_5

FAMILIES: tuple[Family, ...] = (llama.FAMILY, qwen3_5.FAMILY, lfm2.FAMILY, gpt_oss.FAMILY, gemma4.FAMILY)

_families: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add a family to the table; a name it claims that another family already owns is an error."""
    for other in _families.values():
        for kind, theirs, ours in (("architectures", other.architectures, family.architectures),
                                   ("model_types", other.model_types, family.model_types),
                                   ("architecture", dict.fromkeys(other.owned), dict.fromkeys(family.owned))):
            clash = sorted(set(theirs) & set(ours))
            if clash and other.name != family.name:
                raise ConfigError(f"family {family.name!r}: {kind} {clash} already belong to family {other.name!r}")
    _families[family.name] = family
    return family


def unregister(name: str) -> None:
    """Remove a family by name (a toy family a test registered)."""
    _families.pop(name, None)


for _family in FAMILIES:
    register(_family)


def families() -> tuple[Family, ...]:
    return tuple(_families.values())


def architectures(having: Callable[[Family], bool] = lambda family: True) -> tuple[str, ...]:
    """Every `TargetConfig.architecture` value of the families `having` accepts."""
    return tuple(a for family in _families.values() if having(family) for a in family.owned)


def family_of(architecture: str) -> Family:
    """The family a resolved `TargetConfig.architecture` belongs to."""
    for family in _families.values():
        if architecture in family.owned:
            return family
    raise ConfigError(f"architecture {architecture!r} is not supported (supported: {architectures()})")


def target_family(cfg: dict) -> tuple[Family, str]:
    """A target's config.json -> (its family, its `TargetConfig.architecture`)."""
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type", "")
    by_arch = next(((f, f.architectures[a], a) for a in archs for f in _families.values() if a in f.architectures),
                   None)
    by_type = next(((f, f.model_types[model_type]) for f in _families.values() if model_type in f.model_types), None)
    if by_arch is not None and by_type is not None and by_arch[1] != by_type[1]:
        raise ConfigError(f"target config.json disagrees on its architecture: architectures entry {by_arch[2]!r} is "
                          f"{by_arch[1]!r} but model_type={model_type!r} is {by_type[1]!r}")
    if by_arch is not None:
        return by_arch[0], by_arch[1]
    if by_type is not None:
        return by_type
    supported = [a for f in _families.values() for a in f.architectures]
    raise ConfigError(f"target architecture {archs or model_type!r} is not supported "
                      f"(architectures={archs!r}, model_type={model_type!r}; supported: {', '.join(supported)})")


def drafter_dims(cfg: dict, shapes: dict[str, tuple[int, ...]]) -> dict:
    """The drafter dims a family overrides for a drafter whose config copies that family's (else {})."""
    for family in _families.values():
        if family.drafter_dims is not None:
            dims = family.drafter_dims(cfg, shapes)
            if dims:
                return dims
    return {}


def gguf_spelling(gguf_architecture: str) -> GgufSpelling:
    """The family whose GGUF files name `general.architecture` so, as its GGUF spelling."""
    spellings = [f.gguf for f in _families.values() if f.gguf is not None]
    for spelling in spellings:
        if spelling.architecture == gguf_architecture:
            return spelling
    raise ConfigError(f"GGUF architecture {gguf_architecture!r} is not supported "
                      f"(supported: {', '.join(s.architecture for s in spellings)})")


def drafter_model_type() -> str:
    """The `model_type` a published drafter declares: that of the family its layers come from."""
    (model_type,) = {f.drafter_model_type for f in _families.values() if f.drafter_model_type is not None}
    return model_type
