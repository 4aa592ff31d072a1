"""`blockdraft generate` end to end (in-process `main` and one real subprocess)."""

import json
import subprocess
import sys

import pytest

from blockdraft.cli import main
from decode_oracle import generate_one
from blockdraft.sampling.params import SamplingParams
from conftest import ASSETS

TINY = ["--target", str(ASSETS / "target-qwen3")]          # the fast fixture model; the default is SmolLM2
TINY_DSPARK = [*TINY, "--drafter", str(ASSETS / "dspark"), "--no-adaptive-speculation"]  # every step drafts


def run_json(capsys, *args) -> dict:
    assert main(["generate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_matches_library(capsys, target, drafters):
    out = run_json(capsys, "--prompt-ids", "5,6,7,8,9", "--max-new-tokens", "20", *TINY_DSPARK, "--ignore-eos")
    ref = generate_one(target, [5, 6, 7, 8, 9], SamplingParams(max_tokens=20), drafters["dspark"])
    assert out["token_ids"] == ref.token_ids and out["acceptance_lengths"] == ref.acceptance_lengths
    assert set(out["timing"]) >= {"prefill_s", "decode_s", "tokens_per_s"} and out["drafter"] == "dspark"


def test_generate_without_drafter_is_autoregressive(capsys, target):
    out = run_json(capsys, "--target", str(ASSETS / "target-qwen3"), "--prompt", "Hello", "--max-new-tokens", "12",
                   "--ignore-eos")
    assert out["acceptance_lengths"] == [] and len(out["token_ids"]) == 12
    assert out["drafter"] is None


def test_chat_prompt_uses_template(capsys):
    """--chat decodes exactly the chat-templated prompt; without it, exactly the raw text."""
    from blockdraft.tokenizer import Tokenizer

    tok = Tokenizer(ASSETS / "target-qwen3")
    templated = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert templated != tok.encode("hi") and "hi" in tok.apply_chat_template([{"role": "user", "content": "hi"}])
    for flags, ids in ((["--chat"], templated), ([], tok.encode("hi"))):
        text = run_json(capsys, *TINY, "--prompt", "hi", *flags, "--max-new-tokens", "6", "--ignore-eos")
        by_ids = run_json(capsys, *TINY, "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", "6",
                          "--ignore-eos")
        assert text["token_ids"] == by_ids["token_ids"]


@pytest.mark.parametrize("args,message", [
    ([*TINY, "--prompt-ids", "1,2", "--max-new-tokens", "0"], "max_tokens must be a positive integer"),
    ([*TINY, "--prompt-ids", "1,2", "--temperature", "-1"], "temperature must be >= 0"),
    ([*TINY, "--prompt-ids", "1,2", "--top-p", "1.5"], "top_p must be in (0, 1]"),
    ([*TINY, "--prompt-ids", "1,999"], "outside the vocabulary"),
    ([*TINY, "--prompt-ids", "1,2", "--max-new-tokens", "600"], "exceeds the context length"),
    ([*TINY, "--prompt-ids", "1,2", "--drafter", "/nonexistent/drafter"],
     "missing file: /nonexistent/drafter/config.json"),
    (["--prompt-ids", "1,2", "--target", "/nonexistent"], "missing file: /nonexistent/config.json"),
    ([*TINY_DSPARK, "--prompt-ids", "1,2", "--mode", "dflash"], "'dspark' mode"),
    ([*TINY, "--prompt-ids", "1,2", "--drafter", "dspark"], "names a drafter shipped for the default target"),
    (["--prompt-ids", "1,2", "--drafter", "dflash2"], "no DFlash2 drafter is shipped"),
])
def test_user_errors_are_one_line_exit_2(capsys, args, message):
    assert main(["generate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_console_script_subprocess():
    """The installed entry point works as a real process (exit code 2 on a user error)."""
    ok = subprocess.run([sys.executable, "-m", "blockdraft.cli", "generate", *TINY, "--prompt", "ab",
                         "--max-new-tokens", "5", "--json"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)["token_ids"]) <= 5
    bad = subprocess.run([sys.executable, "-m", "blockdraft.cli", "generate", "--prompt-ids", "x"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "comma-separated integers" in bad.stderr


def test_generate_streams_text_and_prints_summary(capsys):
    ref = run_json(capsys, *TINY_DSPARK, "--prompt", "stream me", "--max-new-tokens", "18", "--ignore-eos")
    assert main(["generate", *TINY_DSPARK, "--prompt", "stream me", "--max-new-tokens", "18", "--ignore-eos"]) == 0
    captured = capsys.readouterr()
    assert captured.out.rstrip("\n") == ref["text"]
    summary = captured.err.strip().splitlines()[-1]
    assert summary.startswith("[18 tokens, mean AL") and "tok/s" in summary


def test_serve_shuts_down_cleanly_on_sigint():
    import signal
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "blockdraft.cli", "serve", *TINY_DSPARK, "--port", str(port),
                             "--model-name", "tiny"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise AssertionError("server did not come up")
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                          json={"model": "tiny", "prompt": "x", "max_tokens": 200, "stream": True,
                                "ignore_eos": True}) as r:
            next(r.iter_lines())                                  # a request is in flight
            proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        banner = [line for line in proc.stdout.read().splitlines() if f"http://127.0.0.1:{port}/v1" in line]
        assert len(banner) == 1 and "max batch 8" in banner[0] and "cache" in banner[0], banner
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_default_model_is_smollm2_with_the_shipped_dspark(capsys):
    """No --target: SmolLM2-135M-Instruct (bf16) with its shipped DSpark drafter, as the README's first line."""
    out = run_json(capsys, "--chat", "--prompt", "What is the capital of France?", "--max-new-tokens", "24")
    assert "Paris" in out["text"] and out["drafter"] == "dspark"
    assert sum(out["acceptance_lengths"]) == len(out["token_ids"]) - 1    # plain steps (width 0) count as AL 1
    plain = run_json(capsys, "--chat", "--prompt", "What is the capital of France?", "--max-new-tokens", "24",
                     "--drafter", "none")
    assert plain["token_ids"] == out["token_ids"]                 # lossless on the real model


def test_every_flag_has_help_and_help_shows_defaults(capsys):
    import argparse

    from blockdraft.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, p in [("blockdraft", parser), *commands.items()]:
        for action in p._actions:
            assert action.help, f"{name} {'/'.join(action.option_strings) or action.dest} has no help text"
    for command, shown in (("generate", ["--max-new-tokens MAX_NEW_TOKENS", "(default: 64)", "(default: cpu)"]),
                           ("serve", ["(default: 8000)", "(default: 127.0.0.1)"]),
                           ("train", ["(default: 200)", "(default: 0.003)"])):
        with pytest.raises(SystemExit) as e:
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert e.value.code == 0 and all(s in text for s in shown), (command, text)


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"blockdraft {version('blockdraft')}"


def test_a_users_checkpoint_gets_the_fastest_lossless_numerics(capsys, tmp_path):
    """--dtype auto: a bf16 checkpoint runs in bf16 (row-invariant on the CPU, so speculation is bit-exact),
    as the default model does; an fp32 checkpoint keeps fp32 (bf16 would round its weights); no int4."""
    import shutil

    from safetensors.torch import load_file, save_file

    auto = run_json(capsys, *TINY, "--prompt-ids", "5,6,7", "--max-new-tokens", "4")["numerics"]
    assert (auto["dtype"], auto["quantization"], auto["row_invariant"]) == ("bfloat16", "none", True)
    fp32 = tmp_path / "fp32"
    shutil.copytree(ASSETS / "target-qwen3", fp32)
    save_file({k: v.float() for k, v in load_file(fp32 / "model.safetensors").items()}, fp32 / "model.safetensors")
    stored = run_json(capsys, "--target", str(fp32), "--prompt-ids", "5,6,7", "--max-new-tokens", "4")["numerics"]
    assert (stored["dtype"], stored["row_invariant"]) == ("float32", False)


def test_loading_shows_progress_on_a_terminal_and_json_stays_pure(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    out = run_json(capsys, *TINY_DSPARK, "--prompt-ids", "5,6,7", "--max-new-tokens", "4")
    assert out["token_ids"]                                  # stdout parsed as one JSON object
    assert main(["generate", *TINY_DSPARK, "--prompt-ids", "5,6,7", "--max-new-tokens", "4", "--json"]) == 0
    err = capsys.readouterr().err
    for stage in ("loading target", "loading drafter", "cache", "ready"):
        assert stage in err, (stage, err)


def test_cli_reference_page_is_current():
    """docs/cli.md is generated from the parsers' --help (scripts/gen_cli_docs.py): a flag changed
    without regenerating it fails here."""
    from pathlib import Path
    script = Path(__file__).parents[1] / "scripts" / "gen_cli_docs.py"
    run = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
