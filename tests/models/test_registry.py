"""The target-family registry: lookups, refusals that name the field and value, capabilities, a toy
family added from a test file alone, and no architecture string in shared code."""

import ast
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import blockdraft
from blockdraft.checkpoints.hf_config import decoder_dims
from blockdraft.checkpoints.resolve import resolve_target
from blockdraft.errors import ConfigError
from blockdraft.models import registry
from blockdraft.models.decoder import DecoderLayer
from blockdraft.models.family import Family, plain_decoder
from blockdraft.models.families import llama
from conftest import ASSETS

SRC = Path(blockdraft.__file__).parent


@pytest.mark.parametrize("family", registry.FAMILIES, ids=lambda f: f.name)
def test_every_name_a_family_owns_resolves_to_it(family):
    for name, architecture in family.architectures.items():
        assert registry.target_family({"architectures": [name]}) == (family, architecture)
    for name, architecture in family.model_types.items():
        assert registry.target_family({"model_type": name}) == (family, architecture)
    for architecture in family.owned:
        assert registry.family_of(architecture) is family


def test_unknown_architecture_names_the_fields_and_values():
    with pytest.raises(ConfigError, match=r"architectures=\['MambaForCausalLM'\], model_type='mamba'"):
        registry.target_family({"architectures": ["MambaForCausalLM"], "model_type": "mamba"})
    with pytest.raises(ConfigError, match=r"architecture 'mamba' is not supported"):
        registry.family_of("mamba")


def test_architectures_and_model_type_must_agree():
    with pytest.raises(ConfigError, match=r"'LlamaForCausalLM' is 'llama' but model_type='lfm2' is 'lfm2'"):
        registry.target_family({"architectures": ["LlamaForCausalLM"], "model_type": "lfm2"})
    # a model_type no family owns leaves the architectures entry in charge
    assert registry.target_family({"architectures": ["LlamaForCausalLM"], "model_type": "mistral"})[1] == "llama"


def test_a_name_cannot_belong_to_two_families():
    thief = dataclasses.replace(llama.FAMILY, name="thief", architectures={"LlamaForCausalLM": "thief"},
                                model_types={})
    with pytest.raises(ConfigError, match=r"\['LlamaForCausalLM'\] already belong to family 'llama'"):
        registry.register(thief)
    assert "thief" not in [f.name for f in registry.families()]


def test_capabilities_pick_what_sharding_export_and_fused_kernels_take():
    assert registry.architectures(lambda f: f.capabilities.tensor_parallel) == ("llama", "qwen3")
    assert registry.architectures(lambda f: f.capabilities.onnx_export) == ("llama", "qwen3")
    assert registry.architectures(lambda f: f.capabilities.fused_layer_stack) == ("llama", "qwen3")


# --- a new family is one file's worth of code: here, a toy one defined and registered in this test ---

def _toy_resolve(cfg: dict, architecture: str):
    """A Qwen3 whose logits are soft-capped by its one extra key, `toy_logit_cap`."""
    base = llama.resolve(cfg, "qwen3")
    return dataclasses.replace(base, architecture=architecture, final_logit_softcapping=float(cfg["toy_logit_cap"]))


def _toy_names(tensors, cfg, skipped):
    return {name.replace("final_layernorm.", "norm."): t for name, t in tensors.items()}


TOY = Family(name="toy", architectures={"ToyForCausalLM": "toy"}, model_types={"toy": "toy"},
             resolve=_toy_resolve, decoder=plain_decoder(DecoderLayer), tensor_names=_toy_names)


@pytest.fixture
def toy_dir(tmp_path):
    registry.register(TOY)
    out = tmp_path / "toy"
    shutil.copytree(ASSETS / "target-qwen3", out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(architectures=["ToyForCausalLM"], model_type="toy", toy_logit_cap=2.0)
    (out / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(out / "model.safetensors")
    tensors["model.final_layernorm.weight"] = tensors.pop("model.norm.weight")
    save_file(tensors, out / "model.safetensors")
    yield out
    registry.unregister("toy")


def test_a_registered_toy_family_loads_and_decodes(toy_dir):
    toy = blockdraft.load_target(toy_dir)
    assert toy.config.architecture == "toy" and resolve_target(json.loads((toy_dir / "config.json").read_text()))
    base = blockdraft.load_target(ASSETS / "target-qwen3")
    ids = [[1, 2, 3, 4, 5]]
    assert torch.equal(toy.logits(ids), torch.tanh(base.logits(ids) / 2.0) * 2.0)
    params = blockdraft.SamplingParams(max_tokens=12, ignore_eos=True)
    plain = blockdraft.LLM(target=toy_dir, drafter=None).generate(prompt_token_ids=[[1, 2, 3]], sampling_params=params)
    spec = blockdraft.LLM(target=toy_dir, drafter=ASSETS / "dflash").generate(prompt_token_ids=[[1, 2, 3]],
                                                                             sampling_params=params)
    assert spec[0].token_ids == plain[0].token_ids and len(plain[0].token_ids) == 12


# --- no shared module names a family ---

def _family_names() -> set[str]:
    names = set()
    for family in registry.FAMILIES:
        names |= {*family.architectures, *family.model_types, *family.owned}
    return names


def _string_constants(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_no_shared_module_spells_a_family_name():
    names = _family_names()
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("models/families/") or rel == "models/registry.py":
            continue
        for line, value in _string_constants(path):
            # the name itself, or a prefix of one tested with startswith (e.g. "Gemma4")
            if value in names or (len(value) >= 4 and any(n.startswith(value) for n in names)):
                found.append(f"{rel}:{line}: {value!r}")
    assert not found, "shared modules spell a family's name (ask models/registry.py):\n" + "\n".join(found)
