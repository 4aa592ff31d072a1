"""Every surface agrees with the others and with the single-sequence oracle (`decode.generate_one`):
`generate`, `generate --tp 2`, `bench`, the HTTP server (official openai client) and
`LLM.generate` all run the engine's one step (`generate --onnx` with onnxruntime behind it); each gives
the same tokens and per-step acceptance lengths for the same prompt — AR, DFlash, DFlash2 and
DSpark, greedy and seeded sampling, full draft width (the adaptive width changes acceptance
lengths, never tokens).

ONNX runs the drafter kinds it exports (DSpark, DFlash2 with a sliding window). Its greedy walk
equals the engine (the lattice's candidates hold the full-vocabulary chain). Seeded, it equals the
torch lattice backend at the same K, not the torch drafter: DSpark samples from the K candidates the
lattice holds, and near the token budget the graph drafts DFlash2's full block and the walk
truncates it (as ONNX Runtime GenAI does) where the torch drafter shrinks the block (as z-lab's
dflash_generate does, which the goldens pin), so the sampled walks draw differently there.
"""

import json
from pathlib import Path

import pytest
from openai import OpenAI

from blockdraft.cli import main
from decode_oracle import generate_one
from lattice_oracle import TorchLatticeBackend, lattice_generate
from blockdraft.llm import LLM
from blockdraft.loading import load_drafter, load_target
from blockdraft.sampling.params import SamplingParams
from blockdraft.tokenizer import Tokenizer
from conftest import ASSETS

TARGET = ASSETS / "target-qwen3"
KINDS = ["ar", "dflash", "dflash2", "dspark"]
PROMPT = [5, 6, 7, 8, 9, 10]
TOKENS = 20
MODES = {"greedy": {}, "seeded": {"temperature": 1.0, "seed": 3}}


def _params(mode: str) -> SamplingParams:
    return SamplingParams(max_tokens=TOKENS, ignore_eos=True, **MODES[mode])


def _drafter_dir(kind: str):
    return None if kind == "ar" else ASSETS / kind


@pytest.fixture(scope="module")
def target():
    return load_target(TARGET, "float32")


@pytest.fixture(scope="module")
def oracle(target):
    out = {}
    for kind in KINDS:
        drafter = load_drafter(_drafter_dir(kind), target) if kind != "ar" else None
        for mode in MODES:
            g = generate_one(target, PROMPT, _params(mode), drafter)
            out[kind, mode] = (g.token_ids, g.acceptance_lengths)
    return out


def _cli(capsys, kind: str, mode: str, *extra: str) -> tuple[list[int], list[int]]:
    args = ["generate", "--target", str(TARGET), "--drafter", str(_drafter_dir(kind) or "none"),
            "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", str(TOKENS), "--ignore-eos",
            "--json", "--no-adaptive-speculation", "--dtype", "float32"]
    for key, value in MODES[mode].items():
        args += [f"--{key}", str(value)]
    assert main([*args, *extra]) == 0
    out = json.loads(capsys.readouterr().out)
    return out["token_ids"], out["acceptance_lengths"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_generate_and_llm_api_equal_the_oracle(capsys, oracle, kind, mode):
    assert _cli(capsys, kind, mode) == oracle[kind, mode]
    llm = LLM(target=TARGET, drafter=_drafter_dir(kind) or "none", dtype="float32", adaptive_speculation=False)
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=_params(mode))[0]
    assert (out.token_ids, out.acceptance_lengths) == oracle[kind, mode]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_generate_tp2_equals_the_oracle(capsys, oracle, kind, mode):
    assert _cli(capsys, kind, mode, "--tp", "2") == oracle[kind, mode]


def _sliding_dflash2(tmp_path_factory) -> Path:
    """The tiny DFlash2 with every layer sliding (window 4): ORT-GenAI 0.18 runs DFlash2 only so."""
    import shutil

    dst = tmp_path_factory.mktemp("dflash2-sliding")
    shutil.copytree(ASSETS / "dflash2", dst, dirs_exist_ok=True)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(layer_types=["sliding_attention"] * cfg["num_hidden_layers"], sliding_window=4, use_sliding_window=True)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    out = {}
    for kind, drafter_dir in (("dspark", ASSETS / "dspark"), ("dflash2", _sliding_dflash2(tmp_path_factory))):
        folder = tmp_path_factory.mktemp(f"onnx-{kind}")
        assert main(["export", "onnx", "--target", str(TARGET), "--drafter", str(drafter_dir),
                     "--out", str(folder)]) == 0
        out[kind] = (folder, drafter_dir)
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["dspark", "dflash2"])
def test_generate_onnx_equals_the_engine(capsys, exports, target, kind, mode):
    folder, drafter_dir = exports[kind]
    drafter = load_drafter(drafter_dir, target)
    args = ["generate", "--onnx", str(folder), "--prompt-ids", ",".join(map(str, PROMPT)),
            "--max-new-tokens", str(TOKENS), "--ignore-eos", "--json", "--no-adaptive-speculation"]
    for key, value in MODES[mode].items():
        args += [f"--{key}", str(value)]
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)
    got = (got["token_ids"], got["acceptance_lengths"])
    if mode == "greedy":
        ref = generate_one(target, PROMPT, _params(mode), drafter)
        engine = LLM(target=TARGET, drafter=drafter_dir, dtype="float32", adaptive_speculation=False).generate(
            prompt_token_ids=[PROMPT], sampling_params=_params(mode))[0]
        assert (engine.token_ids, engine.acceptance_lengths) == (ref.token_ids, ref.acceptance_lengths)
    else:
        ref = lattice_generate(TorchLatticeBackend(target, drafter), PROMPT, _params(mode))
    assert got == (ref.token_ids, ref.acceptance_lengths)


def test_server_equals_the_oracle(oracle):
    from blockdraft.server.thread import ServerThread
    from server.server_harness import API_KEY, MODEL

    tok = Tokenizer(TARGET)
    for kind in KINDS:
        llm = LLM(target=TARGET, drafter=_drafter_dir(kind) or "none", dtype="float32", adaptive_speculation=False)
        with ServerThread(llm, MODEL, API_KEY) as srv:
            client = OpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY, max_retries=0)
            for mode in MODES:
                p = MODES[mode]
                r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=TOKENS,
                                              temperature=p.get("temperature", 0.0), seed=p.get("seed"),
                                              extra_body={"ignore_eos": True})
                tokens, lengths = oracle[kind, mode]
                assert r.choices[0].text == tok.decode(tokens), (kind, mode)
                assert r.model_extra["blockdraft"]["acceptance_lengths"] == lengths, (kind, mode)


def test_bench_equals_the_oracle(tmp_path, target):
    """`bench` times the engine: its acceptance lengths over a set are the oracle's on the same prompts."""
    from blockdraft.bench.prompt_sets import load_set
    from blockdraft.sampling.stops import StopCriteria

    kinds = ["dflash", "dflash2", "dspark"]
    assert main(["bench", "--target", str(TARGET), "--drafters", ",".join(f"{k}={ASSETS / k}" for k in kinds),
                 "--sets", "chat", "--quick", "--no-hf", "--temperatures", "0", "--dtype", "float32",
                 "--no-adaptive-speculation", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())["results"]["chat"]["T=0"]
    tok = Tokenizer(TARGET)
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in load_set("chat", 2)]
    stop = StopCriteria(frozenset(target.config.eos_token_ids) | {tok.eos_token_id})
    params = SamplingParams(max_tokens=24)                      # --quick: 2 prompts, 24 tokens
    for kind in kinds:
        drafter = load_drafter(ASSETS / kind, target)
        lengths = [a for p in prompts for a in generate_one(target, p, params, drafter, stop).acceptance_lengths]
        assert report[kind]["steps"] == len(lengths) and report[kind]["mean_al"] == pytest.approx(
            sum(lengths) / len(lengths)), kind
        assert report[kind]["greedy_matches_ar"] == 2
