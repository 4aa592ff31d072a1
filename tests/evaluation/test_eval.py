"""`blockdraft eval` on the tiny fixtures: the report agrees with itself and with the per-item rows,
greedy answers are identical with and without drafting, and bad input fails before any work."""

import json

import pytest

from blockdraft.cli import main
from blockdraft.evaluation.stats import mcnemar_exact
from conftest import ASSETS
from eval_fixtures import default_llm, one_thread  # noqa: F401  (fixtures)

TINY = ["--target", str(ASSETS / "target-qwen3"), "--drafter", str(ASSETS / "dspark"), "--threads", "1"]


def _eval(capsys, *args) -> tuple[int, dict | None, str]:
    code = main(["eval", *TINY, *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_greedy_eval_is_identical_and_consistent(capsys):
    code, r, _ = _eval(capsys, "--set", "math", "--prompts", "6", "--max-new-tokens", "16", "--max-batch", "4")
    assert code == 0 and r["greedy"] and r["items"] == 6
    assert r["identical"] == 6 and r["mismatches"] == [] and all(row["identical"] for row in r["per_item"])
    s, p = r["speculative"], r["plain"]
    assert s["tokens"] == p["tokens"] > 0
    hist = s["al_histogram"]
    assert sum(hist) == s["steps"] and s["mean_al"] == pytest.approx(
        sum(k * n for k, n in enumerate(hist, 1)) / s["steps"])
    lo, hi = s["al_ci95"]
    assert lo <= s["mean_al"] <= hi and len(s["per_position_acceptance"]) == r["block_size"]
    assert s["tokens"] == sum(k * n for k, n in enumerate(hist, 1)) + 6    # first token from the prefill, then ALs
    for arm in ("plain", "speculative"):
        assert r[arm]["accuracy"] == pytest.approx(sum(row[arm] for row in r["per_item"]) / 6)
    q = r["paired"]
    assert q["both"] + q["only_plain"] + q["only_speculative"] + q["neither"] == 6
    assert q["mcnemar_p"] == mcnemar_exact(q["only_plain"], q["only_speculative"])


def test_sampled_eval_and_unscored_chat(capsys):
    code, r, _ = _eval(capsys, "--set", "chat", "--prompts", "3", "--max-new-tokens", "12", "--temperature", "1",
                       "--seed", "3")
    assert code == 0 and not r["greedy"] and not r["scored"] and "paired" not in r
    assert r["plain"]["accuracy"] is None and r["speculative"]["accuracy"] is None
    assert 0 <= r["identical"] <= 3 and r["speculative"]["steps"] > 0
    main(["eval", *TINY, "--set", "chat", "--prompts", "3", "--max-new-tokens", "12"])      # the table
    table = capsys.readouterr().out
    assert "identical answers: 3/3" in table and "mean AL" in table and "per-position acceptance" in table


@pytest.mark.parametrize("args,message", [
    (["--prompts", "0"], "prompts must be an integer >= 1, got 0"),
    (["--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1, got 0"),
    (["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
    (["--temperature", "-1"], "temperature must be >= 0, got -1.0"),
    (["--exec-timeout", "0"], "exec_timeout_s must be > 0"),
    (["--drafter", "none"], "--drafter: eval compares decoding with and without a drafter"),
    (["--set", "humaneval"], "item HumanEval/0:"),                   # longer than the tiny target's 512
    (["--gate", "no/such/gates.json"], "missing gate file: no/such/gates.json"),
])
def test_bad_eval_input_fails_before_work(capsys, args, message):
    code, report, err = _eval(capsys, *args)
    assert code == 2 and report is None and message in err


def test_default_model_answers_identically_with_its_drafter(default_llm):
    from blockdraft.evaluation.run import EvalConfig, run_eval

    cfg = EvalConfig(set="math", prompts=4, max_new_tokens=24, max_batch=4)
    r = run_eval(default_llm.target, default_llm.drafter, default_llm.tokenizer, default_llm._eos_ids(), cfg)
    assert r["identical"] == 4 and r["mismatches"] == []
    assert r["plain"]["accuracy"] == r["speculative"]["accuracy"] is not None      # same answers, same score
    assert r["paired"]["only_plain"] == r["paired"]["only_speculative"] == 0 and r["paired"]["mcnemar_p"] == 1.0
    assert 1.0 < r["speculative"]["mean_al"] <= r["block_size"] + 1
