"""`blockdraft bench`: the report's numbers are consistent with the runs it made, and bad flags fail early."""

import json

import pytest

from blockdraft.bench.prompt_sets import SETS, load_set
from blockdraft.bench.run import acceptance_summary
from blockdraft.cli import main
from blockdraft.train.prompts import stdlib_code, templated_math
from conftest import ASSETS

TINY = ["--target", str(ASSETS / "target-qwen3")]
DRAFTERS = f"dflash={ASSETS / 'dflash'},dspark={ASSETS / 'dspark'}"


def test_acceptance_summary_by_hand():
    s = acceptance_summary([1, 3, 4, 2, 4], 4)
    assert s["mean_al"] == pytest.approx(14 / 5) and s["al_histogram"] == [1, 1, 1, 2]
    # draft k accepted <=> AL > k
    assert s["per_position_acceptance"] == pytest.approx([4 / 5, 3 / 5, 2 / 5])


def test_quick_bench_writes_consistent_report(tmp_path, capsys):
    assert main(["bench", *TINY, "--drafters", DRAFTERS, "--sets", "chat,math", "--quick", "--out",
                 str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert "| chat | 0 | dspark |" in capsys.readouterr().out
    for set_name in ("chat", "math"):
        for temp in ("T=0", "T=1"):
            modes = report["results"][set_name][temp]
            assert set(modes) == {"ar", "dflash", "dspark", "hf"}
            assert modes["ar"]["speedup_vs_ar"] == pytest.approx(1.0)
            for name in ("dflash", "dspark"):
                m = modes[name]
                assert sum(m["al_histogram"]) == m["steps"] > 0
                assert m["mean_al"] == pytest.approx(
                    sum(k * c for k, c in enumerate(m["al_histogram"], 1)) / m["steps"])
                pos = m["per_position_acceptance"]
                assert all(a >= b for a, b in zip(pos, pos[1:]))     # draft k+1 needs draft k
                if temp == "T=0":                                       # lossless: same tokens as AR
                    assert m["greedy_matches_ar"] == 2
            if temp == "T=0":
                assert modes["hf"]["greedy_matches_ar"] == 2         # the outside baseline agrees too


def test_bench_times_the_engine_at_several_batch_sizes(tmp_path):
    assert main(["bench", *TINY, "--drafters", DRAFTERS, "--sets", "chat", "--quick", "--no-hf", "--temperatures", "0",
                 "--batch-sizes", "1,2", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert set(report["results"]["chat"]) == {"T=0,batch=1", "T=0,batch=2"}
    for key, modes in report["results"]["chat"].items():
        assert modes["dspark"]["greedy_matches_ar"] == modes["dflash"]["greedy_matches_ar"] == 2, key
        assert modes["ar"]["tokens"] == modes["dspark"]["tokens"]


@pytest.mark.parametrize("args,message", [
    (["--sets", "chat,poetry"], "unknown set(s) ['poetry']"),
    (["--temperatures", "0,-1"], "--temperatures must be >= 0"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--sets", "humaneval", "--quick"], "exceeds max_position_embeddings=512"),
    (["--batch-sizes", "1,0"], "--batch-sizes must be >= 1"),
])
def test_bad_bench_flags_fail_before_work(tmp_path, capsys, args, message):
    assert main(["bench", *TINY, "--drafters", DRAFTERS, "--no-hf", "--out", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bench.json").exists()


def test_eval_sets_are_held_out_of_training_prompts():
    train = [p.lower() for p in stdlib_code(400) + templated_math(400)]
    for name in SETS:
        for prompt in load_set(name):
            key = prompt.lower()
            assert not any(key in t or t in key for t in train), (name, prompt)
    assert len(load_set("humaneval")) == 164 and len(load_set("chat")) >= 20 and len(load_set("math")) >= 20


def _bench_script(script: str, *args: str):
    """benchmarks/SCRIPT's source and the result of running it with `args`."""
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / script
    return path.read_text(), subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                                            timeout=120)


@pytest.mark.parametrize("script,command", [("bench_runtimes.py", "core"), ("bench_runtimes.py", "onnx"),
                                            ("bench_runtimes.py", "transformers"), ("bench_runtimes.py", "llamacpp")])
def test_benchmark_scripts_time_the_engine_users_run(script, command):
    """They time `LLMEngine` (via `sized_engine`), not the tests' single-sequence oracle, and parse their flags."""
    source, run = _bench_script(script, command, "--help")
    assert "decode_oracle" not in source and "generate_one" not in source and "sized_engine(" in source
    assert run.returncode == 0 and "usage:" in run.stdout and "(default:" in run.stdout, run.stderr


def test_llamacpp_comparison_names_a_missing_llama_bench():
    _, run = _bench_script("bench_runtimes.py", "llamacpp", "--llama-bench", "/nonexistent/llama-bench")
    assert run.returncode != 0 and "--llama-bench /nonexistent/llama-bench: no such file" in run.stderr, run.stderr


def test_the_benchmarks_index_names_every_script_and_sub_command():
    """docs/benchmarks.md's index table has a row per benchmarks/bench_*.py listing its sub-commands."""
    import ast
    from pathlib import Path

    root = Path(__file__).parents[2]
    rows = {line.split("|")[1].strip(" `"): line for line in (root / "docs" / "benchmarks.md").read_text().splitlines()
            if line.startswith("| `benchmarks/bench_")}
    for path in sorted((root / "benchmarks").glob("bench_*.py")):
        row = rows.get(f"benchmarks/{path.name}")
        assert row is not None, f"docs/benchmarks.md's index has no row for {path.name}"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["COMMANDS"]:
                for key in node.value.keys:
                    assert f"`{key.value}`" in row.split("|")[3], f"{path.name} {key.value} is not in its index row"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_benchmark_rounds_put_each_mode_after_each_other_equally_often(n):
    """harness.round_order: over n rounds (2n for odd n) each mode runs equally often in each position and right
    after each other mode (what ran before a mode sets what it finds in a shared cache); two modes alternate."""
    import importlib.util
    from collections import Counter
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("harness", Path(__file__).parents[2] / "benchmarks" / "harness.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    names = ["plain", "fixed", "adaptive", "llamacpp", "other"][:n]
    rows = [harness.round_order(names, r) for r in range(n if n % 2 == 0 else 2 * n)]
    assert all(sorted(row) == sorted(names) for row in rows)
    assert len(set(Counter((m, row.index(m)) for row in rows for m in row).values())) == 1
    after = Counter((row[i], row[i + 1]) for row in rows for i in range(n - 1))
    assert len(after) == n * (n - 1) and len(set(after.values())) <= 1
    if n == 2:
        assert rows == [names, names[::-1]]


def test_controlled_drafter_with_a_draft_vocabulary_keeps_the_chain_inside_it(monkeypatch):
    """`bench_spec.py controlled --draft-vocab N`: the target's greedy continuation stays inside the draft
    vocabulary, the drafter pruned to it proposes that continuation (at rate 1 every draft is accepted: its
    Markov rows sit at the right draft ids), and the output equals plain decoding's."""
    import dataclasses
    import statistics
    from pathlib import Path

    import torch

    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "benchmarks"))
    import bench_spec
    from harness import shaped_configs

    from blockdraft.engine.engine import sized_engine
    from blockdraft.sampling.params import SamplingParams

    cfg = dataclasses.replace(shaped_configs()["smollm2"], vocab_size=1024, hidden_size=128, intermediate_size=256,
                              num_layers=4, num_heads=2, num_kv_heads=1)
    ids = bench_spec.draft_ids(cfg.vocab_size, 256)
    perm = bench_spec.chained_perm(cfg.vocab_size, ids)
    inside = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    inside[ids] = True
    assert sorted(perm.tolist()) == list(range(cfg.vocab_size)) and bool(inside[perm[ids]].all())
    with torch.inference_mode():
        target = bench_spec.chained_target(cfg, "int4", perm)
        drafter = bench_spec.chained_drafter(target, perm, 1.0, ids)
        assert drafter.config.draft_vocab_size == 256
        prompt = ids[torch.randint(0, 256, (16,), generator=torch.Generator().manual_seed(0))].tolist()
        params = SamplingParams(max_tokens=32, ignore_eos=True)
        plain = sized_engine(target, None, 1, 96, frozenset()).generate([prompt], params)[0]
        spec = sized_engine(target, drafter, 1, 96, frozenset(), adaptive_speculation=False).generate([prompt], params)[0]
    seq = prompt[-1:] + plain.token_ids
    assert all(int(perm[a]) == b for a, b in zip(seq, seq[1:]))
    assert spec.token_ids == plain.token_ids and statistics.fmean(spec.acceptance_lengths) > 6
    with pytest.raises(SystemExit, match="--draft-vocab 2000"):
        bench_spec.draft_ids(cfg.vocab_size, 2000)
