"""Tap point (docs/design.md §2): which value of a tapped layer a drafter reads, resolved once.

`hidden_states` (z-lab DFlash/DFlash2, HF output_hidden_states) reads the last layer after the
final norm; `layer_output` (DeepSpec DSpark and its ports) before it. They differ exactly when
the target's last layer is tapped.
"""

import json

import pytest
import torch

from blockdraft.checkpoints.publish import new_drafter, published_config
from blockdraft.checkpoints.resolve import resolve_drafter
from blockdraft.config import Taps
from blockdraft.errors import ConfigError
from blockdraft.loading import load_drafter, load_models
from conftest import ASSETS

SHIPPED = ASSETS.parent / "smollm2"


def _config(name: str) -> dict:
    return json.loads((ASSETS / name / "config.json").read_text())


def _shapes(name: str) -> dict:
    from safetensors import safe_open

    with safe_open(str(ASSETS / name / "model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.mark.parametrize("name, expected", [("dspark", "layer_output"), ("dflash", "hidden_states"),
                                            ("dflash2", "hidden_states"), ("dflash-sliding", "hidden_states")])
def test_layout_decides_the_default(name, expected):
    assert resolve_drafter(_config(name), _shapes(name)).tap_point == expected


@pytest.mark.parametrize("spelling", ["tap_point", "dspark_tap_point"])
def test_explicit_key_wins(spelling):
    cfg = _config("dspark") | {spelling: "hidden_states"}
    assert resolve_drafter(cfg, _shapes("dspark")).tap_point == "hidden_states"
    flash = _config("dflash") | {"tap_point": "layer_output"}
    assert resolve_drafter(flash, _shapes("dflash")).tap_point == "layer_output"


def test_unknown_tap_point_is_a_named_error():
    with pytest.raises(ConfigError, match="tap_point 'pre_norm'"):
        resolve_drafter(_config("dspark") | {"tap_point": "pre_norm"}, _shapes("dspark"))


def test_contexts_differ_exactly_when_the_last_layer_is_tapped(target):
    ids = torch.tensor([[5, 17, 3, 99, 42, 7]])
    last = target.config.num_layers - 1
    for layers in [(0, 2), (1,), (0, last), (last,)]:
        post = target(ids, tap_layers=Taps(layers, "hidden_states")).taps
        raw = target(ids, tap_layers=Taps(layers, "layer_output")).taps
        width = target.config.hidden_size
        for j, layer in enumerate(layers):
            a, b = post[..., j * width:(j + 1) * width], raw[..., j * width:(j + 1) * width]
            if layer == last:
                assert not torch.equal(a, b)
                assert torch.allclose(a, target.norm(b))          # the same stream, one side normed
            else:
                assert torch.equal(a, b)


def test_drafters_we_train_record_their_tap_point(target):
    spark = new_drafter(target, "dspark", 1, 4, (0, 3), 1)
    flash = new_drafter(target, "dflash", 1, 4, (0, 3), 1)
    assert published_config(spark.config, target)["tap_point"] == "layer_output"
    assert published_config(flash.config, target)["tap_point"] == "hidden_states"


def test_shipped_smollm2_drafters_say_what_they_were_trained_on():
    """Both tap the last layer (29 of 30): DSpark was trained on its raw output (layer_output), DFlash
    on the post-norm value (hidden_states); each config records it, and each MODEL_CARD agrees."""
    for kind, point in (("dspark", "layer_output"), ("dflash", "hidden_states")):
        cfg = json.loads((SHIPPED / kind / "config.json").read_text())
        assert cfg.get("tap_point") == point and 29 in (cfg.get("target_layer_ids")
                                                         or cfg["dflash_config"]["target_layer_ids"])
        assert f"read at `{point}`" in (SHIPPED / kind / "MODEL_CARD.md").read_text()


def test_embedded_dspark_drafter_is_recognised_and_refused(target, tmp_path):
    """DeepSeek-V4 ships its DSpark draft inside the target checkpoint (`mtp.*`): name it, never load it
    as a standalone drafter (TensorRT-LLM's deployment-form probe)."""
    import shutil

    from safetensors.torch import load_file, save_file

    embedded = tmp_path / "v4-like"
    shutil.copytree(ASSETS / "dspark", embedded)
    tensors = load_file(str(embedded / "model.safetensors"))
    tensors["mtp.0.attn.wq.weight"] = torch.zeros(4, 4)
    save_file(tensors, str(embedded / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"embedded DSpark drafter \(1 tensors under mtp\.\*"):
        load_drafter(embedded, target)
    with pytest.raises(ConfigError, match="is the target itself"):
        load_models(ASSETS / "target-qwen3", ASSETS / "target-qwen3")
    with pytest.raises(ConfigError, match="is the target itself"):
        load_drafter(ASSETS / "target-qwen3", target, target_dir=ASSETS / "target-qwen3")


def test_cli_refuses_the_target_as_its_own_drafter(capsys):
    from blockdraft.cli import main

    target_dir = str(ASSETS / "target-qwen3")
    assert main(["generate", "--target", target_dir, "--drafter", target_dir, "--prompt-ids", "1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is the target itself" in err[0]
