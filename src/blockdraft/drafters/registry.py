"""The one table of drafter kinds: a kind's name, or a published architecture, to the `DrafterKind` that owns it.

Every other module asks this table (or the record it returns) instead of testing a kind's name. A new kind
is one file beside this one, named as the kind, and one entry in `NAMES`. The names are known without
importing the kinds (and torch), so a command line can offer them as choices; a kind's module loads the
first time its record is asked for.
"""

from __future__ import annotations

from functools import cache
from importlib import import_module
from typing import Callable

from ..errors import ConfigError
from .kind import DrafterKind, Training

NAMES: tuple[str, ...] = ("dflash", "dflash2", "dspark")      # each the name of its module here
DEFAULT_KIND = "dspark"                                        # what `blockdraft train` fits unless told


@cache
def kinds() -> tuple[DrafterKind, ...]:
    loaded = tuple(import_module(f"{__package__}.{name}").KIND for name in NAMES)
    for name, kind in zip(NAMES, loaded):
        if kind.name != name:
            raise ConfigError(f"drafters/{name}.py exports the kind {kind.name!r}; a kind's module is named as it")
    return loaded


def names(having: Callable[[DrafterKind], bool] | None = None) -> tuple[str, ...]:
    """The kinds' names (those `having` accepts), in table order."""
    return NAMES if having is None else tuple(kind.name for kind in kinds() if having(kind))


def drafter_kind(name: str) -> DrafterKind:
    if name not in NAMES:
        raise ConfigError(f"drafter kind {name!r} is not supported (supported: {NAMES})")
    return kinds()[NAMES.index(name)]


@cache
def _by_architecture() -> dict[str, DrafterKind]:
    return {a: kind for kind in kinds() for a in kind.architectures}


def kind_of_architecture(architecture: str) -> DrafterKind | None:
    """The kind a config.json `architectures` entry names: listed by a kind, else containing its hint."""
    listed = _by_architecture().get(architecture)
    if listed is not None:
        return listed
    return next((k for k in kinds() if k.architecture_hint and k.architecture_hint in architecture), None)


def architectures() -> list[str]:
    return sorted(_by_architecture())


def tensor_spellings() -> dict[str, tuple[str, ...]]:
    """Canonical head tensor name -> the spellings published checkpoints use, over every kind."""
    return {name: spellings for kind in kinds() for name, spellings in kind.tensor_spellings.items()}


def spellings() -> dict[str, tuple[str, ...]]:
    """Every kind's head field -> the places published configs spell it."""
    return {name: places for kind in kinds() for name, places in kind.spellings.items()}


def kind_of_heads(heads) -> DrafterKind | None:
    """The kind whose head settings `heads` is (None for None)."""
    return next((kind for kind in kinds() if kind.heads is not None and isinstance(heads, kind.heads)), None)


def suffixless() -> tuple[str, ...]:
    """Tensors every kind publishes without the `.weight` suffix."""
    return tuple(name for kind in kinds() for name in kind.suffixless)


def training_of(name: str) -> Training:
    """How the kind named `name` trains; a named ConfigError for a kind that has no loss here."""
    kind = drafter_kind(name)
    if kind.training is None:
        trainable = " or ".join(names(lambda k: k.training is not None))
        raise ConfigError(f"train --kind {name} is not supported: blockdraft has no loss for {kind.title}'s "
                          f"heads; train {trainable}")
    return kind.training
