"""`blockdraft eval` end to end: load the target and drafter, resolve the gate row (when one is
asked for) and the conditions it was measured under, run both arms, check or record the gate.

Everything a user can get wrong — set, counts, a gate row that does not exist or conditions that
contradict it — is refused before any token is generated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..default_model import DEFAULT_DRAFTER
from ..errors import ConfigError
from .gate import CONDITION_FIELDS, GateKey, GateRow, check, load_gates, record
from .lm_eval_task import PREFIX, run_lm_eval_task
from .run import EvalConfig, run_eval


@dataclass(frozen=True)
class EvalOutcome:
    report: dict
    failures: tuple[str, ...]            # why the run fails (greedy mismatch, gate below threshold), if it does


def gate_key(llm, target, drafter, set_name: str) -> GateKey:
    """What a gate row is keyed by: model and drafter by name (the default model is `smollm2`, a
    shipped drafter its name, a directory its folder name), set, block size, dtype/quantization."""
    from ..default_model import NAME
    from ..llm import DEFAULT_DRAFTERS, is_default_target

    model = NAME if is_default_target(target) else Path(target).resolve().name
    name = str(drafter) if str(drafter) in DEFAULT_DRAFTERS else Path(drafter).resolve().name
    return GateKey(model, name, set_name, llm.drafter.config.block_size,
                   f"{llm.numerics['dtype']}/{llm.numerics['quantization']}")


def with_gate_conditions(cfg: EvalConfig, row: GateRow, given: dict) -> EvalConfig:
    """The gate row's measurement conditions; an explicitly given, different value is refused by name."""
    for name in CONDITION_FIELDS:
        if given.get(name) is not None and given[name] != getattr(row, name):
            raise ConfigError(f"--{name.replace('_', '-')} {given[name]} contradicts the gate row [{row.key}], "
                              f"measured with {name}={getattr(row, name)}; leave it out to use the row's")
    return replace(cfg, prompts=row.prompts, max_new_tokens=row.max_new_tokens, temperature=row.temperature)


def evaluate(cfg: EvalConfig, target=None, drafter=DEFAULT_DRAFTER, gate: str | None = None,
             record_gate: str | None = None, given: dict | None = None, lm_eval_options: dict | None = None,
             **llm_kwargs) -> EvalOutcome:
    """`given`: the conditions the user set explicitly (prompts, max_new_tokens, temperature), checked
    against a gate row. `lm_eval_options` (include_path, num_fewshot, chat) apply to `lm-eval:TASK`
    sets. `llm_kwargs`: how to load (mode, dtype, quantization, device, block_size)."""
    from ..llm import LLM

    if drafter is None or str(drafter) == "none":
        raise ConfigError("--drafter: eval compares decoding with and without a drafter; got none")
    if gate and record_gate:
        raise ConfigError("--gate and --record-gate: check a reference or record one, not both")
    gates = load_gates(gate) if gate else None
    llm = LLM(target=target, drafter=drafter, max_batch=1, max_model_len=64, adaptive_speculation=False,
              **llm_kwargs)                          # loads the models; run_eval sizes its own engines
    key = gate_key(llm, target, drafter, cfg.set)
    row = None
    if gates is not None:
        row = gates.find(key)
        cfg = with_gate_conditions(cfg, row, given or {})
    if cfg.set.startswith(PREFIX):
        opts = lm_eval_options or {}
        report = run_lm_eval_task(llm, cfg, opts.get("include_path"), opts.get("num_fewshot"), opts.get("chat", False))
    else:
        report = run_eval(llm.target, llm.drafter, llm.tokenizer, llm._eos_ids(), cfg)
    report.update(model=key.model, drafter=key.drafter, numerics=llm.numerics)
    failures = []
    if report["greedy"] and report.get("mismatches"):
        # lossless decoding: a greedy answer that changes with the drafter is a bug, whatever the accuracy
        failures.append(f"greedy answers differ with and without drafting: {report['mismatches']}")
    if (row is not None or record_gate) and report["speculative"]["mean_al"] is None:
        raise ConfigError(f"set {cfg.set}: no tokens were generated, so there is no acceptance length to gate")
    if row is not None:
        result = check(gates, row, report["speculative"]["mean_al"])
        report["gate"] = result.as_dict()
        if not result.passed:
            failures.append(result.message())
    if record_gate:
        record(record_gate, GateRow(key, len(report["per_item"]), cfg.max_new_tokens, cfg.temperature,
                                    report["speculative"]["mean_al"]))
        report["recorded"] = {"file": str(record_gate), "row": str(key)}
    return EvalOutcome(report, tuple(failures))
