"""The drafter-kind registry: every kind in one file, lookups and refusals that name the value, and no
kind name or published drafter architecture spelled in shared code."""

import ast
from pathlib import Path

import pytest

import blockdraft
from blockdraft.checkpoints.resolve import resolve_drafter
from blockdraft.cli import main
from blockdraft.drafters import registry
from blockdraft.errors import ConfigError

SRC = Path(blockdraft.__file__).parent


@pytest.mark.parametrize("kind", registry.kinds(), ids=lambda k: k.name)
def test_each_kind_lives_in_its_own_module_and_owns_its_architectures(kind):
    assert (SRC / "drafters" / f"{kind.name}.py").is_file()
    assert registry.drafter_kind(kind.name) is kind
    for arch in kind.architectures:
        assert registry.kind_of_architecture(arch) is kind


def test_an_architecture_belongs_to_one_kind():
    owners = {}
    for kind in registry.kinds():
        for arch in kind.architectures:
            assert arch not in owners, f"{arch} is claimed by {owners[arch]} and {kind.name}"
            owners[arch] = kind.name


def test_unknown_kind_is_named():
    with pytest.raises(ConfigError, match=r"drafter kind 'medusa' is not supported \(supported: \('dflash'"):
        registry.drafter_kind("medusa")
    with pytest.raises(ConfigError, match=r"--mode 'medusa' is not a drafter kind"):
        resolve_drafter({"architectures": ["DFlashDraftModel"]}, {}, mode="medusa")


def test_a_kind_without_a_loss_is_refused_by_train_before_any_work(capsys):
    untrainable = registry.names(lambda k: k.training is None)
    assert untrainable, "every kind trains: this refusal has nothing left to pin"
    for name in untrainable:
        with pytest.raises(ConfigError, match=rf"train --kind {name} is not supported: .* train dflash or dspark"):
            registry.training_of(name)
        assert main(["train", "--target", "/nonexistent", "--kind", name, "--prompts", "builtin:2",
                     "--taps", "1", "--out", "/nonexistent/out"]) == 2
        assert f"train --kind {name} is not supported" in capsys.readouterr().err


@pytest.mark.parametrize("kind", registry.names(lambda k: k.heads is not None))
def test_head_settings_belong_to_their_kind(kind, drafters):
    """A kind's head settings (`DrafterConfig.heads`) live in its module; a drafter carrying them under
    another kind is refused by name, and an object no kind owns is refused."""
    import dataclasses

    heads = drafters[kind].config.heads
    assert isinstance(heads, registry.drafter_kind(kind).heads)
    assert registry.kind_of_heads(heads).name == kind
    plain = drafters["dflash"].config
    with pytest.raises(ConfigError, match=rf"declares {registry.drafter_kind(kind).title} heads \(.*\) but runs "
                                          rf"as 'dflash'; run it in '{kind}' mode"):
        dataclasses.replace(plain, heads=heads)
    with pytest.raises(ConfigError, match=r"heads=\{'markov_rank': 4\} are no drafter kind's head settings"):
        dataclasses.replace(plain, heads={"markov_rank": 4})


def test_architecture_hint_names_unlisted_layouts():
    assert registry.kind_of_architecture("Qwen3_5DSparkDraftModel").name == "dspark"
    assert registry.kind_of_architecture("LlamaForCausalLM") is None


# --- no shared module names a kind ---

# Shared modules that still spell a kind's name, each with what keeps it there.
STILL_SPELLED = {
    "default_model.py": "DEFAULT_DRAFTER: the shipped drafter (assets/smollm2/dspark) the default command runs",
    "train/recipe.py": "KINDS, PRUNED: the recipe of the drafters shipped for SmolLM2 (the kinds it trains, and "
                       "which of them prune their vocabulary)",
}


def _kind_names() -> set[str]:
    return {*registry.names()} | {a for kind in registry.kinds() for a in kind.architectures}


def test_no_shared_module_spells_a_kind_name():
    names = _kind_names()
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("drafters/") or rel in STILL_SPELLED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, "shared modules spell a drafter kind (ask drafters/registry.py):\n" + "\n".join(found)
