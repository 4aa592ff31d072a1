"""lm-evaluation-harness integration on a local task written here (YAML + JSON lines; nothing is
downloaded): `python -m blockdraft.lm_eval` end to end, `simple_evaluate(model="blockdraft")` with
and without the drafter giving identical greedy answers (few-shot and chat template honoured), and
log-likelihoods equal to the target's own logits."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ASSETS
from eval_fixtures import one_thread  # noqa: F401  (autouse)

pytest.importorskip("lm_eval")

TARGET, DRAFTER = ASSETS / "target-qwen3", ASSETS / "dspark"
ROWS = [{"question": "What is 2 + 2?", "answer": "4", "choices": ["3", "4", "5"], "label": 1},
        {"question": "What colour is the sky?", "answer": "blue", "choices": ["blue", "red"], "label": 0},
        {"question": "How many legs has a cat?", "answer": "4", "choices": ["2", "4", "6"], "label": 1},
        {"question": "Name the capital of France.", "answer": "Paris", "choices": ["Rome", "Paris"], "label": 1}]


@pytest.fixture
def task_dir(tmp_path, monkeypatch):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
              "fewshot_split: test\ndoc_to_text: \"Question: {{question}}\\nAnswer:\"\n")
    (tmp_path / "bd_gen.yaml").write_text(
        "task: bd_gen\n" + common + "output_type: generate_until\ndoc_to_target: \" {{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\", \"Question:\"]\n  max_gen_toks: 12\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")
    (tmp_path / "bd_mc.yaml").write_text(
        "task: bd_mc\n" + common + "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: label\nmetric_list:\n  - metric: acc\n")
    for name, value in (("HF_DATASETS_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"),
                        ("HF_DATASETS_CACHE", str(tmp_path / "cache"))):
        monkeypatch.setenv(name, value)
    return tmp_path


@pytest.mark.slow                 # lm-eval's command line indexes its ~10k built-in tasks first (~9 s)
def test_python_m_blockdraft_lm_eval_runs_a_local_task(task_dir):
    out = task_dir / "results"
    cmd = [sys.executable, "-m", "blockdraft.lm_eval", "--model", "blockdraft", "--model_args",
           f"target={TARGET},drafter={DRAFTER},threads=1", "--tasks", "bd_gen", "--include_path", str(task_dir),
           "--device", "cpu", "--batch_size", "4", "--output_path", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "|bd_gen|" in run.stdout and "exact_match" in run.stdout
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    stats = results["config"]["blockdraft"]
    assert results["results"]["bd_gen"]["exact_match,none"] is not None
    assert stats["requests"] == 4 and stats["drafter_kind"] == "dspark" and stats["mean_al"] >= 1
    assert stats["verify_steps"] > 0 and len(stats["per_position_acceptance"]) == 5


def _samples(results, task):
    return {s["doc_id"]: s for s in results["samples"][task]}


def test_simple_evaluate_greedy_answers_equal_without_drafter(task_dir):
    import blockdraft.lm_eval  # noqa: F401  (registers "blockdraft")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    runs = {}
    for drafter in (DRAFTER, "none"):
        runs[drafter] = simple_evaluate(model="blockdraft", model_args=f"target={TARGET},drafter={drafter}",
                                        tasks=["bd_gen"], num_fewshot=2, apply_chat_template=True,
                                        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False), log_samples=True,
                                        batch_size=4, device="cpu")
    spec, plain = (_samples(runs[d], "bd_gen") for d in (DRAFTER, "none"))
    assert len(spec) == 4 and [spec[i]["resps"] for i in spec] == [plain[i]["resps"] for i in spec]
    prompt = spec[0]["arguments"][0][0]
    assert prompt.startswith("<|im_start|>user") and prompt.count("Question:") == 3    # 2 shots + the question
    stats = runs[DRAFTER]["config"]["blockdraft"]
    assert stats["mean_al"] > 1 and runs["none"]["config"]["blockdraft"]["verify_steps"] == 0


def test_loglikelihoods_equal_the_targets_own_logits():
    from lm_eval.api.instance import Instance

    from blockdraft.lm_eval import BlockdraftLM

    lm = BlockdraftLM(target=str(TARGET), drafter="none", max_batch=1)

    def expected(context_ids, continuation_ids):
        ids = context_ids + continuation_ids
        logprobs = torch.log_softmax(lm.llm.target.logits(ids)[0].float(), dim=-1)   # the whole sequence at once
        rows = range(len(context_ids) - 1, len(ids) - 1)
        return sum(float(logprobs[r, t]) for r, t in zip(rows, continuation_ids))

    pairs = [("Question: What is 2 + 2?\nAnswer:", " 4"), ("The sky is", " blue today")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)])
    for (ctx, cont), (logprob, _) in zip(pairs, got):
        whole = lm.tok_encode(ctx + cont)
        ctx_ids = lm.tok_encode(ctx)
        assert logprob == pytest.approx(expected(ctx_ids, whole[len(ctx_ids):]), rel=1e-5)
    text = "What colour is the sky? It is blue."
    (rolling,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert rolling == pytest.approx(expected([lm.prefix_token_id], lm.tok_encode(text, add_special_tokens=False)),
                                    rel=1e-5)


def test_unknown_model_args_are_named():
    from blockdraft.errors import ConfigError
    from blockdraft.lm_eval import BlockdraftLM

    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['drafterr'\]"):
        BlockdraftLM(target=str(TARGET), drafterr="x")


def test_lm_evals_own_gsm8k_task_on_a_local_copy(tmp_path, monkeypatch):
    """docs/evaluation.md's recipe: lm-eval's gsm8k.yaml with dataset_path/dataset_name replaced by local files."""
    import lm_eval
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import blockdraft.lm_eval  # noqa: F401

    rows = [{"question": "Tom has 3 apples and buys 2 more. How many apples does he have?",
             "answer": "He has 3 + 2 = <<3+2=5>>5 apples.\n#### 5"},
            {"question": "A box holds 4 pens. How many pens are in 3 boxes?",
             "answer": "3 boxes hold 3 * 4 = <<3*4=12>>12 pens.\n#### 12"}]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shipped = (Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text()
    local = shipped.replace("task: gsm8k\n", "task: gsm8k_local\n").replace(
        "dataset_path: openai/gsm8k\ndataset_name: main\n",
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    train: {tmp_path / 'train.jsonl'}\n"
        f"    test: {tmp_path / 'test.jsonl'}\n")
    assert local.count("gsm8k_local") == 1 and "openai/gsm8k" not in local
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "gsm8k_local.yaml").write_text(local)
    for name, value in (("HF_DATASETS_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"),
                        ("HF_DATASETS_CACHE", str(tmp_path / "cache"))):
        monkeypatch.setenv(name, value)
    results = simple_evaluate(model="blockdraft", model_args=f"target={TARGET},drafter={DRAFTER},max_gen_toks=16",
                              tasks=["gsm8k_local"], num_fewshot=1, device="cpu", batch_size=2,
                              task_manager=TaskManager(include_path=str(tasks), include_defaults=False))
    scores = results["results"]["gsm8k_local"]
    assert "exact_match,strict-match" in scores and "exact_match,flexible-extract" in scores
    assert results["config"]["blockdraft"]["requests"] == 2


def test_blockdraft_eval_runs_an_lm_eval_task_with_and_without_the_drafter(task_dir, capsys):
    from blockdraft.cli import main

    args = ["eval", "--target", str(TARGET), "--drafter", str(DRAFTER), "--include-path", str(task_dir),
            "--threads", "1", "--json"]
    assert main([*args, "--set", "lm-eval:bd_gen", "--num-fewshot", "1", "--chat-template"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["set"] == "lm-eval:bd_gen" and r["items"] == 4 and r["identical"] == 4 and r["mismatches"] == []
    assert r["lm_eval"] == {"task": "bd_gen", "filter": "none", "metric": "exact_match"}
    assert r["plain"]["tokens"] == r["speculative"]["tokens"] > 0 and r["speculative"]["mean_al"] > 1
    q = r["paired"]
    assert q["both"] + q["only_plain"] + q["only_speculative"] + q["neither"] == 4
    assert main([*args, "--set", "lm-eval:no_such_task"]) == 2
    assert "lm-eval knows no task 'no_such_task'" in capsys.readouterr().err
