"""Every accepted spelling activates what it names; every refusal is a named error."""

import copy
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from blockdraft.checkpoints.resolve import resolve_drafter
from blockdraft.errors import BlockdraftError, ConfigError
from blockdraft.loading import load_drafter
from conftest import ASSETS

DSPARK_CFG = json.loads((ASSETS / "dspark" / "config.json").read_text())
DFLASH_CFG = json.loads((ASSETS / "dflash" / "config.json").read_text())
DSPARK_SHAPES = {k: tuple(v.shape) for k, v in load_file(ASSETS / "dspark" / "model.safetensors").items()}
DFLASH_SHAPES = {k: tuple(v.shape) for k, v in load_file(ASSETS / "dflash" / "model.safetensors").items()}
BASE_KEYS = ("target_layer_ids", "block_size", "mask_token_id", "markov_rank", "enable_confidence_head",
             "confidence_head_with_markov")


def dspark_bare() -> dict:
    cfg = copy.deepcopy(DSPARK_CFG)
    for k in BASE_KEYS:
        cfg.pop(k, None)
    cfg["architectures"] = ["SomethingElse"]
    return cfg


SPELLINGS = {  # name -> (config edits, expectations)
    "deepseek-top-level": ({"architectures": ["Qwen3DSparkModel"], "target_layer_ids": [0, 2], "block_size": 5,
                            "mask_token_id": 126, "markov_rank": 16, "enable_confidence_head": True}, {}),
    "dspark-prefixed": ({"architectures": ["DSparkDraftModel"], "dspark_target_layer_ids": [0, 2],
                         "dspark_block_size": 5, "dspark_mask_token_id": 126, "dspark_markov_rank": 16,
                         "dspark_enable_confidence_head": True}, {}),
    "nested-dspark-config": ({"architectures": ["MyDSparkDrafter"], "dspark_config": {
        "target_layer_ids": [0, 2], "block_size": 5, "mask_token_id": 126, "markov_rank": 16,
        "enable_confidence_head": True, "confidence_head_with_markov": True}}, {}),
    "specforge-projector": ({"architectures": ["DFlashDraftModel"], "dflash_config": {
        "projector_type": "dspark", "target_layer_ids": [0, 2], "block_size": 5, "mask_token_id": 126,
        "markov_rank": 16, "enable_confidence_head": True}}, {}),
    "heads-imply-kind": ({"target_layer_ids": [0, 2], "block_size": 5, "mask_token_id": 126}, {}),
}


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_spelling_activates_dspark_heads(name):
    edits, _ = SPELLINGS[name]
    cfg = {**dspark_bare(), **edits}
    if name == "heads-imply-kind":
        cfg.pop("architectures")
    resolved = resolve_drafter(cfg, DSPARK_SHAPES)
    assert resolved.kind == "dspark"
    heads = resolved.heads
    assert heads.markov_rank == 16 and heads.enable_confidence_head and heads.confidence_head_with_markov
    assert resolved.shift_label and resolved.num_draft_tokens == 5
    assert resolved.target_layer_ids == (0, 2) and resolved.block_size == 5 and resolved.mask_token_id == 126


def test_explicit_mode_and_runtime_json():
    cfg = dspark_bare()
    runtime = {"model": {"dspark": {"block_size": 5, "mask_token_id": 126, "target_layer_ids": [0, 2],
                                    "num_draft_tokens": 5}}}
    assert resolve_drafter(cfg, DSPARK_SHAPES, runtime=runtime).kind == "dspark"
    assert resolve_drafter({**cfg, "target_layer_ids": [0, 2], "block_size": 5, "mask_token_id": 126},
                           DSPARK_SHAPES, mode="dspark").kind == "dspark"


def test_dflash_spellings_and_defaults():
    r = resolve_drafter(DFLASH_CFG, DFLASH_SHAPES)
    assert r.kind == "dflash" and not r.shift_label and r.num_draft_tokens == r.block_size - 1
    assert r.heads is None                                  # no Markov or confidence head


def test_training_keys_are_ignored():
    cfg = {**DSPARK_CFG, "num_anchors": 1, "confidence_head_alpha": 0.1, "loss_decay_gamma": 7,
           "ce_loss_alpha": 0.1, "l1_loss_alpha": 0.9, "transformers_version": "5.0", "use_cache": True}
    assert resolve_drafter(cfg, DSPARK_SHAPES).kind == "dspark"


REFUSALS = {
    "dspark-heads-as-dflash-mode": (lambda c, s: (c, s, "dflash"), "'dspark' mode"),
    "dspark-heads-with-dflash-arch": (lambda c, s: ({**c, "architectures": ["DFlashDraftModel"]}, s, None),
                                      "'dspark' mode"),
    "rank-zero-weights": (lambda c, s: (c, {**s, "markov_head.markov_w1.weight": (128, 0),
                                            "markov_head.markov_w2.weight": (128, 0)}, None), "rank 0"),
    "rank-mismatch": (lambda c, s: ({**c, "markov_rank": 8}, s, None), "markov_rank=8"),
    "conflicting-spellings": (lambda c, s: ({**c, "dspark_block_size": 7}, s, None), "conflicting values for block_size"),
    "shift-label-off-full-block": (lambda c, s: ({**c, "shift_label": False, "num_draft_tokens": 5}, s, None),
                                   "read past the block"),
    "gated-markov": (lambda c, s: ({**c, "markov_head_type": "gated"}, s, None), "markov_head_type='gated'"),
    "mask-outside-vocab": (lambda c, s: ({**c, "mask_token_id": 500}, s, None), "mask_token_id=500"),
    "no-taps": (lambda c, s: ({k: v for k, v in c.items() if k != "target_layer_ids"}, s, None), "target_layer_ids"),
    "block-size-1": (lambda c, s: ({**c, "block_size": 1}, s, None), "block_size must be >= 2"),
    "hyper-connections": (lambda c, s: ({**c, "hc_mult": 4}, s, None), "hc_mult"),
    "both-runtime-aliases": (lambda c, s: (c, s, None, {"model": {"dspark": {}, "dflash2": {}}}), "both model.dflash2"),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refusals_name_the_problem(name):
    build, message = REFUSALS[name]
    args = build(copy.deepcopy(DSPARK_CFG), dict(DSPARK_SHAPES))
    cfg, shapes, mode = args[:3]
    runtime = args[3] if len(args) > 3 else None
    with pytest.raises(ConfigError, match=None) as err:
        resolve_drafter(cfg, shapes, mode=mode, runtime=runtime)
    assert message in str(err.value)


def _drafter_copy(tmp_path, name, edit_config=None, edit_tensors=None):
    dst = tmp_path / name
    shutil.copytree(ASSETS / name, dst)
    if edit_config:
        cfg = json.loads((dst / "config.json").read_text())
        edit_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if edit_tensors:
        tensors = load_file(dst / "model.safetensors")
        edit_tensors(tensors)
        save_file(tensors, dst / "model.safetensors")
    return dst


LOAD_REFUSALS = {
    "taps-outside-target": (lambda c: c["dflash_config"].update(target_layer_ids=[0, 9]), None,
                            "outside the target's [0, 4)"),
    "fc-width": (lambda c: c["dflash_config"].update(target_layer_ids=[0, 1, 2]), None, "fc.weight input width 128"),
    "vocab-mismatch": (lambda c: c.update(vocab_size=130), None, "vocab_size=130"),
    "hidden-mismatch": (lambda c: c.update(hidden_size=32), None, "hidden_size=32"),
    "heads-not-dividing": (lambda c: c.update(num_key_value_heads=3), None, "not divisible"),
    "missing-tensor": (None, lambda t: t.pop("fc.weight"), "missing tensors ['fc.weight']"),
}


@pytest.mark.parametrize("name", sorted(LOAD_REFUSALS))
def test_load_time_checks(target, tmp_path, name):
    edit_cfg, edit_t, message = LOAD_REFUSALS[name]
    path = _drafter_copy(tmp_path, "dflash", edit_cfg, edit_t)
    with pytest.raises(BlockdraftError) as err:
        load_drafter(path, target)
    assert message in str(err.value)


def test_missing_files_are_named(target, tmp_path):
    with pytest.raises(BlockdraftError, match="missing file: .*config.json"):
        load_drafter(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps(DFLASH_CFG))
    with pytest.raises(BlockdraftError, match="no \\*.safetensors"):
        load_drafter(tmp_path, target)


def test_bare_markov_names_and_shared_embedding_load_identically(target, drafters, tmp_path):
    """DSpark without its own embed/lm_head copies (shared with target) and bare head names."""

    def rename(t):
        t["markov_w1.weight"] = t.pop("markov_head.markov_w1.weight")
        t["markov_w2.weight"] = t.pop("markov_head.markov_w2.weight")

    path = _drafter_copy(tmp_path, "dspark", edit_tensors=rename)
    d = load_drafter(path, target)
    assert d.config.kind == "dspark" and d.config.heads.markov_rank == 16
    ref = drafters["dspark"]
    assert torch.equal(d.markov_head.markov_w1.weight, ref.markov_head.markov_w1.weight)
