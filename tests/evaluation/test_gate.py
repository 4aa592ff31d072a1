"""Acceptance gates: the shipped drafters hold their shipped references on the default model, a
drafter with perturbed weights fails its row by name, and gate files are validated."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from blockdraft.cli import main
from blockdraft.errors import ConfigError
from blockdraft.evaluation.gate import SHIPPED, GateKey, check, load_gates
from blockdraft.evaluation.run import EvalConfig, run_eval
from blockdraft.llm import DEFAULT_DRAFTERS
from blockdraft.loading import load_drafter
from conftest import ASSETS
from eval_fixtures import default_llm, one_thread  # noqa: F401  (fixtures)

TINY = ["--target", str(ASSETS / "target-qwen3"), "--threads", "1", "--set", "math"]


def _gated_al(llm, drafter, row) -> float:
    cfg = EvalConfig(set=row.key.set, prompts=row.prompts, max_new_tokens=row.max_new_tokens,
                     temperature=row.temperature, compare_plain=False)
    return run_eval(llm.target, drafter, llm.tokenizer, llm._eos_ids(), cfg)["speculative"]["mean_al"]


def _numerics(llm) -> str:
    return f"{llm.numerics['dtype']}/{llm.numerics['quantization']}"


def test_shipped_drafters_pass_their_gates(default_llm):
    gates = load_gates(SHIPPED)
    rows = [r for r in gates.rows if r.key.model == "smollm2" and r.key.numerics == _numerics(default_llm)]
    assert {r.key.drafter for r in rows} == {"dflash", "dspark"}, f"no shipped rows for {_numerics(default_llm)}"
    for row in rows:
        drafter = default_llm.drafter if row.key.drafter == "dspark" else \
            load_drafter(DEFAULT_DRAFTERS[row.key.drafter], default_llm.target)
        assert row.key.block_size == drafter.config.block_size
        result = check(gates, row, _gated_al(default_llm, drafter, row))
        assert result.passed, result.message()


def test_perturbed_drafter_fails_its_gate(default_llm, tmp_path):
    gates = load_gates(SHIPPED)
    row = gates.find(GateKey("smollm2", "dspark", "math", 8, _numerics(default_llm)))
    perturbed = tmp_path / "dspark"
    shutil.copytree(DEFAULT_DRAFTERS["dspark"], perturbed)
    _perturb(perturbed, 3.0)                        # noise 3x the size of the weights themselves
    result = check(gates, row, _gated_al(default_llm, load_drafter(perturbed, default_llm.target), row))
    assert not result.passed and result.measured_al < 0.95 * row.ref_al
    assert "gate FAILED [model=smollm2, drafter=dspark, set=math, block_size=8" in result.message()


def _perturb(directory, scale: float) -> None:
    weights = load_file(directory / "model.safetensors")
    g = torch.Generator().manual_seed(1)
    for name, w in weights.items():
        if name.startswith(("fc.", "layers.")) and w.dim() == 2:
            weights[name] = (w.float() + scale * w.float().std() * torch.randn(w.shape, generator=g)).to(w.dtype)
    save_file(weights, directory / "model.safetensors")


def test_gate_cli_records_passes_and_fails_a_perturbed_copy(tmp_path, capsys):
    drafter = tmp_path / "dspark"                        # the gate names a drafter directory by its folder
    shutil.copytree(ASSETS / "dspark", drafter)
    gates = tmp_path / "gates.json"
    common = [*TINY, "--drafter", str(drafter), "--prompts", "4", "--max-new-tokens", "16"]
    assert main(["eval", *common, "--record-gate", str(gates)]) == 0
    row = json.loads(gates.read_text())["rows"][0]
    assert row["drafter"] == "dspark" and row["model"] == "target-qwen3" and row["ref_al"] > 1.5
    capsys.readouterr()
    assert main(["eval", *TINY, "--drafter", str(drafter), "--gate", str(gates)]) == 0      # the row's conditions
    assert "gate passed" in capsys.readouterr().err
    _perturb(drafter, 3.0)
    assert main(["eval", *TINY, "--drafter", str(drafter), "--gate", str(gates), "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["gate"]["passed"] is False
    assert "gate FAILED [model=target-qwen3, drafter=dspark, set=math, block_size=" in err
    assert main(["eval", *TINY, "--drafter", str(drafter), "--gate", str(gates), "--max-new-tokens", "99"]) == 2
    assert "--max-new-tokens 99 contradicts the gate row" in capsys.readouterr().err
    assert main(["eval", *TINY, "--drafter", str(ASSETS / "dflash"), "--gate", str(gates)]) == 2
    assert "no gate row for [model=target-qwen3, drafter=dflash" in capsys.readouterr().err


@pytest.mark.parametrize("content,message", [
    ({"format": "blockdraft-acceptance-gates", "version": 2, "rows": []}, "version 1, got"),
    ({"format": "blockdraft-acceptance-gates", "version": 1, "tolerance": 1.5, "rows": []}, "'tolerance' must be"),
    ({"format": "blockdraft-acceptance-gates", "version": 1,
      "rows": [{"model": "m", "drafter": "d", "set": "math", "block_size": 8, "numerics": "bfloat16/none",
                "prompts": 4, "max_new_tokens": 16, "temperature": 0}]}, "rows[0]: field 'ref_al'"),
])
def test_malformed_gate_files_are_named_errors(tmp_path, content, message):
    path = tmp_path / "gates.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_gates(path)
