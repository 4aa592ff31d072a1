"""Tensor parallelism (gloo, 2 CPU ranks): TP=2 equals TP=1 token for token, the vocab-sharded Markov
chain equals the full-vocabulary chain (ties across the shard boundary included), bad TP sizes are
refused before any process starts, and a dead worker is an error, not a hang."""

import json
import sys
import time
from pathlib import Path

import pytest
import torch

from blockdraft.cli import main
from decode_oracle import generate_one
from blockdraft.errors import ConfigError
from blockdraft.loading import load_drafter, load_target
from blockdraft.parallel.launch import WorkerError, run_tp
from blockdraft.parallel.shard import check_tp
from blockdraft.cli.tp import GenerateJob, generate_task
from blockdraft.sampling.params import SamplingParams
from conftest import ASSETS, random_prompts

sys.path.insert(0, str(Path(__file__).parent))
import tp_tasks  # noqa: E402

TARGET = ASSETS / "target-qwen3"
PROMPTS = tuple(tuple(p) for p in random_prompts(3, seed=71))
# TP=2 equals TP=1 in fp32 (up to fp32 rounding of the sharded sums); in bf16 the sharded partial sums round
# differently from the whole ones, so bf16 TP output is its own (still lossless under the same TP size)
FP32 = ["--target", str(TARGET), "--dtype", "float32"]


def _llm(drafter_dir) -> dict:
    """The engine on both ranks (a batch of all prompts), fp32, full draft width."""
    return dict(target=TARGET, drafter=drafter_dir or "none", dtype="float32", adaptive_speculation=False)


@pytest.mark.parametrize("drafter", [None, "dflash", "dflash2", "dspark", "dflash-sliding"])
def test_tp2_equals_tp1_tokens_acceptance_and_logits(drafter):
    drafter_dir = ASSETS / drafter if drafter else None
    job = GenerateJob(_llm(drafter_dir), PROMPTS, SamplingParams(max_tokens=32, ignore_eos=True), return_logits=True)
    tp2 = run_tp(2, generate_task, job)
    target = load_target(TARGET, "float32")
    d = load_drafter(drafter_dir, target) if drafter_dir else None
    for prompt, gen, logits in zip(PROMPTS, tp2["generations"], tp2["logits"]):
        ref = generate_one(target, list(prompt), SamplingParams(max_tokens=32, ignore_eos=True), d)
        assert gen.token_ids == ref.token_ids
        assert gen.acceptance_lengths == ref.acceptance_lengths
        assert (logits - target.logits(list(prompt))[0]).abs().max().item() <= 1e-4


def test_tp2_seeded_sampling_equals_tp1():
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=5, ignore_eos=True)
    job = GenerateJob(_llm(ASSETS / "dspark"), PROMPTS[:2], params)
    tp2 = run_tp(2, generate_task, job)
    target = load_target(TARGET, "float32")
    d = load_drafter(ASSETS / "dspark", target)
    for prompt, gen in zip(PROMPTS[:2], tp2["generations"]):
        ref = generate_one(target, list(prompt), params, d)
        assert gen.token_ids == ref.token_ids and gen.acceptance_lengths == ref.acceptance_lengths


@pytest.mark.parametrize("with_bias", [False, True])
def test_sharded_markov_chain_equals_full_chain(with_bias):
    out = run_tp(2, tp_tasks.chain_task, (16, with_bias))
    for name in ("greedy", "sampled"):
        full, sharded = out[name]
        assert full == sharded, name
    assert out["lattice_ids"][0] == out["lattice_ids"][1] and out["lattice_scores_diff"] <= 1e-5
    if not with_bias:
        greedy = out["greedy"][0][0]
        assert greedy[0] == 7 and greedy[1] == 3      # ties: lowest id, across and within shards
        assert out["topk_slot0"][:2] == [7, 8]


@pytest.mark.parametrize("tp,field", [(3, "num_attention_heads=4"), (2, "vocab_size=129")])
def test_indivisible_sizes_are_refused_before_launch(tp, field):
    import dataclasses

    target = load_target(TARGET, "float32")
    cfg = target.config if tp == 3 else dataclasses.replace(target.config, vocab_size=129)
    with pytest.raises(ConfigError, match=field.replace("(", r"\(")):
        check_tp(tp, cfg)


def test_cli_tp_refuses_bad_size_without_starting_workers(capsys, monkeypatch):
    from blockdraft.parallel import launch

    started = []
    monkeypatch.setattr(launch, "run_tp", lambda *args, **kwargs: started.append(args))
    assert main(["generate", "--target", str(TARGET), "--prompt-ids", "1,2", "--tp", "3"]) == 2
    assert "num_attention_heads=4 is not divisible by the TP size 3" in capsys.readouterr().err
    assert not started, "workers were launched before the TP size was checked"


def test_cli_generate_tp2_matches_tp1(capsys):
    args = ["generate", *FP32, "--drafter", str(ASSETS / "dspark"), "--prompt-ids", "5,6,7,8",
            "--max-new-tokens", "20", "--ignore-eos", "--json", "--no-adaptive-speculation"]
    assert main(args) == 0
    one = json.loads(capsys.readouterr().out)
    assert main([*args, "--tp", "2"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["token_ids"] == one["token_ids"] and two["acceptance_lengths"] == one["acceptance_lengths"]
    assert two["tp"] == 2 and two["numerics"] == one["numerics"] and one["numerics"]["dtype"] == "float32"


def test_a_dead_worker_is_an_error_not_a_hang():
    """The launcher sees rank 1's exit (its code, 3, in the error) and stops rank 0, which would otherwise
    wait in a barrier until the collective timeout."""
    with pytest.raises(WorkerError, match=r"rank 1 died \(exit code 3\); the other ranks were stopped"):
        run_tp(2, tp_tasks.die_task, None, timeout_s=20)


def test_shard_topk_matches_torch_topk_on_distinct_values():
    x = torch.randn(5, 16)
    out = run_tp(2, tp_tasks.topk_task, x)
    assert torch.equal(out, torch.topk(x, 6, dim=-1).indices)


def test_serve_tp2_answers_like_tp1_and_stops_on_sigint(capsys):
    """A real `blockdraft serve --tp 2` (rank 0 serves, rank 1 follows) through the openai client."""
    import os
    import signal
    import socket
    import subprocess

    import httpx
    from openai import OpenAI

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = [*FP32, "--drafter", str(ASSETS / "dspark")]
    proc = subprocess.Popen([sys.executable, "-m", "blockdraft.cli", "serve", *model, "--tp", "2", "--port",
                             str(port), "--model-name", "tiny"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise AssertionError("TP server did not come up")
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        got = [client.completions.create(model="tiny", prompt="Hello there", max_tokens=16, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text for _ in range(2)]
        assert main(["generate", *model, "--prompt", "Hello there", "--max-new-tokens", "16", "--ignore-eos",
                     "--json"]) == 0
        ref = json.loads(capsys.readouterr().out)["text"]
        assert got == [ref, ref]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert proc.returncode == 0, proc.stdout.read()[-2000:]


def test_bench_tp2_reports_like_tp1(tmp_path):
    drafters = f"dspark={ASSETS / 'dspark'}"
    common = ["bench", *FP32, "--drafters", drafters, "--sets", "math", "--quick", "--no-hf",
              "--no-adaptive-speculation",
              "--temperatures", "0"]
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    assert main([*common, "--tp", "2", "--out", str(tmp_path / "two")]) == 0
    one = json.loads((tmp_path / "one" / "bench.json").read_text())
    two = json.loads((tmp_path / "two" / "bench.json").read_text())
    assert two["tp"] == 2 and one["tp"] == 1
    a, b = one["results"]["math"]["T=0"]["dspark"], two["results"]["math"]["T=0"]["dspark"]
    assert a["al_histogram"] == b["al_histogram"] and b["greedy_matches_ar"] == 2


def test_sharding_itself_refuses_to_drop_heads():
    """Even when called directly (no CLI check first), sharding never slices an indivisible head count."""
    from blockdraft.parallel.layers import TPGroup
    from blockdraft.parallel.shard import shard_target

    with pytest.raises(ConfigError, match="num_attention_heads=4 is not divisible by the TP size 3"):
        shard_target(load_target(TARGET, "float32"), TPGroup(0, 3))
