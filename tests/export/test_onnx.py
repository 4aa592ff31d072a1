"""ONNX export + onnxruntime backend: lattice parity with torch, identical end-to-end greedy tokens and
acceptance lengths, shared initializers, and named errors for a runtime JSON that breaks the contract."""

import json
import shutil

import onnx
import pytest
import torch

from blockdraft.bench.ortgenai import engine_generate
from blockdraft.cli import main
from blockdraft.engine.onnx_runner import onnx_engine
from decode_oracle import generate_one
from blockdraft.errors import BlockdraftError, ConfigError
from blockdraft.export.onnx_export import export_onnx
from lattice_oracle import OnnxBackend, TorchLatticeBackend, lattice_generate
from blockdraft.drafters.dspark import greedy_chain
from blockdraft.loading import load_drafter, load_target
from blockdraft.sampling.params import SamplingParams
from blockdraft.sampling.stops import StopCriteria
from conftest import ASSETS, random_prompts

TARGET = ASSETS / "target-qwen3"
PROMPTS = random_prompts(4, seed=61)
# (fixture, layers): "sliding" = every layer slides (window 4: og.Engine keeps a ring), "mixed" = layer 0
# slides and layer 1 is full (a full pool; the graph masks layer 0 by its window). A dflash2 drafter
# exports only when every layer slides (the 0.18 runtime gives DFlash2 one ring).
CASES = [("dspark", "full"), ("dspark", "sliding"), ("dspark", "mixed"), ("dflash2", "sliding"),
         ("dspark-last", "full")]


def _drafter_dir(tmp_path_factory, name: str, layers: str):
    if layers == "full":
        return ASSETS / name
    dst = tmp_path_factory.mktemp(f"{name}-{layers}")
    shutil.copytree(ASSETS / name, dst, dirs_exist_ok=True)
    cfg = json.loads((dst / "config.json").read_text())
    types = ["sliding_attention"] * cfg["num_hidden_layers"] if layers == "sliding" else \
        ["sliding_attention", "full_attention"]
    cfg.update(layer_types=types, sliding_window=4, use_sliding_window=True)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def exported(request, tmp_path_factory):
    name, layers = request.param
    drafter_dir = _drafter_dir(tmp_path_factory, name, layers)
    out = export_onnx(TARGET, drafter_dir, tmp_path_factory.mktemp("export") / "out", "fp32")
    target = load_target(TARGET, "float32")
    return out, TorchLatticeBackend(target, load_drafter(drafter_dir, target)), target


def og_engine_generate(folder, prompts: list[list[int]], max_new: int) -> tuple[list[list[int]], dict]:
    """All prompts at once through ONNX Runtime GenAI 0.18's own og.Engine on the CPU provider (greedy)."""
    _, tokens, stats = engine_generate(folder, prompts, max_new)
    return tokens, stats


def test_lattice_outputs_match_torch(exported):
    out, torch_backend, _ = exported
    ort_backend = OnnxBackend(out)
    prompt = PROMPTS[0]
    for backend in (ort_backend, torch_backend):
        backend.reset()
    logits_o, taps_o = ort_backend.target_step(prompt, 0)
    logits_t, taps_t = torch_backend.target_step(prompt, 0)
    assert (logits_o - logits_t).abs().max().item() <= 1e-4 and (taps_o - taps_t).abs().max().item() <= 1e-4
    block = [int(logits_t[-1].argmax())] + [torch_backend.mask_token_id] * (torch_backend.block_size - 1)
    lat_o = ort_backend.draft(taps_o, 0, block)
    lat_t = torch_backend.draft(taps_t, 0, block)
    n, k = torch_backend.num_draft_tokens, torch_backend.top_k
    assert tuple(lat_o.candidate_ids.shape) == (1, n, k)         # the graph's int32, widened by the backend
    assert lat_o.scores.dtype == torch.float32 and tuple(lat_o.scores.shape) == (1, n, k, k)
    assert torch.equal(lat_o.candidate_ids[..., 0], lat_t.candidate_ids[..., 0])        # top-1 identical
    assert torch.equal(lat_o.candidate_ids, lat_t.candidate_ids)
    assert (lat_o.scores - lat_t.scores).abs().max().item() <= 1e-4


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_end_to_end_tokens_and_acceptance_equal_torch(exported, temperature):
    """Pools start as NaN: the graphs must never let an unwritten page through (og.Engine does not
    clear its pages, and a NaN key times a zero attention weight is still NaN)."""
    out, torch_backend, _ = exported
    ort_backend = OnnxBackend(out, pool_fill=float("nan"))
    stop = StopCriteria(eos_ids=frozenset({127}))
    for i, prompt in enumerate(PROMPTS):
        params = SamplingParams(max_tokens=40, temperature=temperature, seed=i)
        a = lattice_generate(ort_backend, prompt, params, stop)
        b = lattice_generate(torch_backend, prompt, params, stop)
        assert a.token_ids == b.token_ids and a.acceptance_lengths == b.acceptance_lengths
        if temperature == 0:
            assert a.token_ids == generate_one(torch_backend.target, prompt, params, None, stop).token_ids


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_engine_runs_the_export_batched(exported, temperature):
    """The engine's step with onnxruntime behind it (`generate --onnx`): four requests at once over the
    engine's own block tables (pools start as NaN) equal the single-sequence lattice loop on the same
    export — tokens and acceptance lengths, greedy and seeded."""
    out, _, _ = exported
    stop = StopCriteria(eos_ids=frozenset({127}))
    engine = onnx_engine(out, max_batch=4, eos_ids=frozenset({127}), adaptive_speculation=False,
                         pool_fill=float("nan"))
    params = [SamplingParams(max_tokens=40, temperature=temperature, seed=i) for i in range(len(PROMPTS))]
    single = OnnxBackend(out)
    for prompt, p, got in zip(PROMPTS, params, engine.generate(PROMPTS, params)):
        ref = lattice_generate(single, prompt, p, stop)
        assert (got.token_ids, got.acceptance_lengths) == (ref.token_ids, ref.acceptance_lengths)


def test_og_engine_runs_the_export_on_cpu(exported):
    """ONNX Runtime GenAI 0.18's own Engine loads the export on the CPU provider and decodes all prompts
    batched: greedy tokens equal blockdraft's plain decoding, and its speculative counters equal
    blockdraft's onnxruntime backend on the same export — the same drafts accepted; og counts a round
    only where it drafts, and it does not draft when one token is left (min(n, room - 1) drafts),
    where blockdraft's loop drafts one and verifies it."""
    out, torch_backend, target = exported
    max_new = 40
    stop = StopCriteria(eos_ids=frozenset({127}))
    tokens, stats = og_engine_generate(out, PROMPTS, max_new)
    ours = OnnxBackend(out)
    accepted = rounds = 0
    for prompt, got in zip(PROMPTS, tokens):
        params = SamplingParams(max_tokens=max_new)
        assert got == generate_one(target, prompt, params, None, stop).token_ids
        gen = lattice_generate(ours, prompt, params, stop)
        assert gen.token_ids == got
        room = max_new - 1                                   # after the prefill's token
        for produced in gen.acceptance_lengths:
            if room > 1:
                rounds += 1
                accepted += produced - 1
            room -= produced
    assert stats["draft_forward_passes"] > 0 and stats["draft_tokens_proposed"] > 0
    assert stats["draft_tokens_accepted"] == accepted and stats["rounds"] == rounds
    assert stats["dflash2_failures"] == 0 and stats["dflash2_admission_misses"] == 0


def test_full_vocab_lattice_equals_the_markov_chain_path(tmp_path):
    """With K = vocab the walk is the full-vocabulary chain: the ONNX path equals generate_one (and so the
    dspark-mlx goldens' semantics), acceptance lengths included."""
    out = export_onnx(TARGET, ASSETS / "dspark", tmp_path / "out", "fp32", top_k=128)
    target = load_target(TARGET, "float32")
    drafter = load_drafter(ASSETS / "dspark", target)
    backend = OnnxBackend(out)
    for prompt in PROMPTS[:2]:
        params = SamplingParams(max_tokens=30)
        ref = generate_one(target, prompt, params, drafter)
        got = lattice_generate(backend, prompt, params)
        assert got.token_ids == ref.token_ids and got.acceptance_lengths == ref.acceptance_lengths


def test_default_k_follows_the_chain_when_the_markov_bias_dominates(tmp_path):
    """A DSpark drafter whose Markov bias moves the argmax out of the base top-8: the exported
    lattice still holds the greedy chain's token, so `generate --onnx` at the default K equals the
    full-vocabulary torch path (generate_one), tokens and per-step acceptance lengths — through the
    single-sequence loop and through the engine (`generate --onnx`), three requests batched."""
    from safetensors.torch import load_file, save_file

    src, dst = ASSETS / "dspark", tmp_path / "bias"
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    tensors["markov_head.markov_w2.weight"] = tensors["markov_head.markov_w2.weight"] * 6
    save_file(tensors, str(dst / "model.safetensors"))
    target = load_target(TARGET, "float32")
    drafter = load_drafter(dst, target)
    out = export_onnx(TARGET, dst, tmp_path / "out", "fp32")                  # default K = 8
    backend, torch_k8 = OnnxBackend(out), TorchLatticeBackend(target, drafter)
    engine = onnx_engine(out, max_batch=3, adaptive_speculation=False)          # `generate --onnx`
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    batched = engine.generate(PROMPTS[:3], params)
    moved = 0
    for prompt, from_engine in zip(PROMPTS[:3], batched):
        ref = generate_one(target, prompt, params, drafter)
        got = lattice_generate(backend, prompt, params)
        assert got.token_ids == ref.token_ids and got.acceptance_lengths == ref.acceptance_lengths
        assert (from_engine.token_ids, from_engine.acceptance_lengths) == (ref.token_ids, ref.acceptance_lengths)
        assert lattice_generate(torch_k8, prompt, params).acceptance_lengths == ref.acceptance_lengths
        ids = target(torch.tensor([prompt]), tap_layers=drafter.config.taps)
        cache = drafter.new_cache()
        drafter.extend_context(ids.taps, cache)
        anchor = ids.logits[0, -1].argmax().view(1)
        logits = drafter.logits(drafter.block_hidden(anchor, drafter.config.block_size, cache))
        chain = greedy_chain(logits, anchor, drafter.markov_head)
        moved += int((~(logits[0].topk(8, dim=-1).indices == chain[0][:, None]).any(-1)).sum())
    assert moved > 0, "the Markov bias never left the base top-8: the check is vacuous"


def test_shared_initializers_are_stored_once(exported):
    """The target's embedding and LM head are stored once (shared_weights.bin) and both graphs point
    there; the config lists no `shared_initializers`, which og.Engine 0.18 cannot load on CPU."""
    out, torch_backend, _ = exported
    cfg = torch_backend.drafter.config
    runtime = json.loads((out / "genai_config.json").read_text())
    kinds = [k for k in ("dspark", "dflash2") if k in runtime["model"]]
    assert len(kinds) == 1
    reused = (not cfg.own_embed_tokens) + (not cfg.own_lm_head)   # the tiny DSpark ships its own copies
    shared_bytes = reused * 128 * 64 * 4                          # tiny target: untied [128, 64] embedding and head
    assert (out / "shared_weights.bin").stat().st_size == shared_bytes
    assert all("shared_initializers" not in runtime["model"][k] for k in ("decoder", kinds[0]))
    for graph in ("model.onnx", f"{kinds[0]}.onnx"):
        model = onnx.load(str(out / graph), load_external_data=False)
        locations = {e.value for i in model.graph.initializer for e in i.external_data if e.key == "location"}
        assert ("shared_weights.bin" in locations) == (reused > 0), graph


def _corrupt(out, tmp_path, edit):
    """`edit(genai_config)` on a copy of the export."""
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    runtime = json.loads((bad / "genai_config.json").read_text())
    edit(runtime)
    (bad / "genai_config.json").write_text(json.dumps(runtime))
    return bad


def _section(r):
    return r["model"]["dspark" if "dspark" in r["model"] else "dflash2"]


@pytest.mark.parametrize("edit,message", [
    (lambda r: r["model"].update(dflash2=dict(_section(r)), dspark=dict(_section(r))), "both model.dflash2 and"),
    (lambda r: _section(r).update(selector_top_k=_section(r)["selector_top_k"] + 1), "axis 2 is"),
    (lambda r: _section(r).update(head_size=7), "axis 3 is 16, genai_config.json declares 7"),
    (lambda r: r["engine"]["dynamic_batching"].update(block_size=16), "axis 1 is 32, genai_config.json declares 16"),
    (lambda r: _section(r)["outputs"].update(scores="lattice_scores"), "'lattice_scores' named in genai_config"),
    (lambda r: _section(r)["inputs"].update(qkv_row_map="rows"), "'rows' named in genai_config"),
    (lambda r: _section(r).update(num_draft_tokens=_section(r)["block_size"] + 3), "num_draft_tokens="),
    (lambda r: _section(r).update(filename="missing.onnx"), "missing file:"),
    (lambda r: r["model"].pop("decoder"), "model.decoder (the target graph) is missing"),
    (lambda r: r["model"]["decoder"].pop("head_size"), "field 'head_size' is missing"),
    (lambda r: r.pop("engine"), "genai_config.json: engine is missing"),
])
def test_corrupted_runtime_json_is_refused_by_name(exported, tmp_path, edit, message):
    with pytest.raises(ConfigError) as err:
        OnnxBackend(_corrupt(exported[0], tmp_path, edit))
    assert message in str(err.value)


def test_export_refuses_what_the_contract_cannot_hold(tmp_path, tmp_path_factory):
    with pytest.raises(ConfigError, match="kind='dflash'"):
        export_onnx(TARGET, ASSETS / "dflash", tmp_path / "a")
    with pytest.raises(ConfigError, match=r"sliding_window > 0"):
        export_onnx(TARGET, ASSETS / "dflash2", tmp_path / "b")        # full attention: 0.18 refuses it
    with pytest.raises(ConfigError, match=r"layer windows are \[4, None\]"):
        export_onnx(TARGET, _drafter_dir(tmp_path_factory, "dflash2", "mixed"), tmp_path / "b")
    sliding = _drafter_dir(tmp_path_factory, "dflash2", "sliding")
    with pytest.raises(ConfigError, match="selector_top_k=4"):
        export_onnx(TARGET, sliding, tmp_path / "b", top_k=6)
    with pytest.raises(ConfigError, match="--page-size must be a positive integer, got 0"):
        export_onnx(TARGET, ASSETS / "dspark", tmp_path / "c", page_size=0)
    with pytest.raises(BlockdraftError, match="missing file"):
        export_onnx(TARGET, tmp_path / "nope", tmp_path / "c")
    assert not any(p.name.startswith(("a", "b", "c")) for p in tmp_path.iterdir())


def test_cli_export_and_generate_onnx_match_torch(tmp_path, capsys):
    out = tmp_path / "exp"
    assert main(["export", "onnx", "--target", str(TARGET), "--drafter", str(ASSETS / "dspark"), "--out",
                 str(out)]) == 0
    capsys.readouterr()
    assert main(["generate", "--onnx", str(out), "--prompt-ids", "5,6,7,8", "--max-new-tokens", "24",
                 "--ignore-eos", "--json", "--no-adaptive-speculation"]) == 0
    got = json.loads(capsys.readouterr().out)
    target = load_target(TARGET, "float32")
    ref = lattice_generate(TorchLatticeBackend(target, load_drafter(ASSETS / "dspark", target)), [5, 6, 7, 8],
                           SamplingParams(max_tokens=24, ignore_eos=True))
    assert got["token_ids"] == ref.token_ids and got["acceptance_lengths"] == ref.acceptance_lengths
    assert got["backend"] == "onnxruntime" and set(got["timing"]) >= {"prefill_s", "decode_s", "tokens_per_s"}
    assert main(["generate", "--onnx", str(out), "--target", str(TARGET), "--prompt-ids", "1"]) == 2
    assert "--target does not apply" in capsys.readouterr().err
    assert main(["generate", "--onnx", str(out), "--prompt-ids", "5,999"]) == 2          # before any work
    assert "prompt token ids [999] outside the vocabulary [0, 128)" in capsys.readouterr().err


def test_bf16_export_stores_bf16_weights_and_agrees(tmp_path):
    """bf16 = bf16 initializers cast to fp32 at use (onnxruntime's CPU provider has no bf16 Gemm). The
    tiny fixtures are bf16 checkpoints, so rounding loses nothing: outputs must equal the fp32 export."""
    bf16 = export_onnx(TARGET, ASSETS / "dspark", tmp_path / "bf16", "bf16")
    fp32 = export_onnx(TARGET, ASSETS / "dspark", tmp_path / "fp32", "fp32")
    model = onnx.load(str(bf16 / "model.onnx"), load_external_data=False)
    assert any(i.data_type == onnx.TensorProto.BFLOAT16 for i in model.graph.initializer)
    for name in ("model.onnx.data", "dspark.onnx.data"):
        assert (bf16 / name).stat().st_size < 0.6 * (fp32 / name).stat().st_size     # small tensors stay fp32
    a, b = OnnxBackend(bf16), OnnxBackend(fp32)
    for prompt in PROMPTS[:2]:
        ga = lattice_generate(a, prompt, SamplingParams(max_tokens=30))
        gb = lattice_generate(b, prompt, SamplingParams(max_tokens=30))
        assert ga.token_ids == gb.token_ids and ga.acceptance_lengths == gb.acceptance_lengths


def test_onnxruntime_genai_parses_the_genai_config(exported):
    """ONNX Runtime GenAI 0.18.0's own parser (unknown keys are fatal there) reads our genai_config.json."""
    import onnxruntime_genai as og

    og.Config(str(exported[0]))
    bad = exported[0].parent / "with-unknown-key"
    shutil.copytree(exported[0], bad, dirs_exist_ok=True)
    runtime = json.loads((bad / "genai_config.json").read_text())
    _section(runtime)["tap_point"] = "layer_output"                # a key of ours the parser does not know
    (bad / "genai_config.json").write_text(json.dumps(runtime))
    with pytest.raises(Exception, match="Unknown value"):         # the check is not vacuous
        og.Config(str(bad))


@pytest.mark.slow
def test_og_engine_runs_the_default_model_export(tmp_path):
    """The default model (SmolLM2-135M, Llama) with its shipped DSpark drafter (pruned vocabulary,
    last layer tapped at layer_output): og.Engine on the CPU provider decodes two chat prompts at
    once, greedy tokens equal blockdraft's plain decoding in the export's numerics (fp32), and it
    drafts and accepts exactly what blockdraft's backend does on the same export."""
    from blockdraft.bench.prompt_sets import load_set
    from blockdraft.default_model import smollm2_dir
    from blockdraft.llm import DEFAULT_DRAFTERS
    from blockdraft.tokenizer import Tokenizer

    out = export_onnx(smollm2_dir(), DEFAULT_DRAFTERS["dspark"], tmp_path / "smollm2", "fp32")
    tok = Tokenizer(smollm2_dir())
    prompts = [tok.encode_chat([{"role": "user", "content": t}]) for t in load_set("chat", 2)]
    max_new = 24
    tokens, stats = og_engine_generate(out, prompts, max_new)
    target = load_target(smollm2_dir(), "float32")
    stop = StopCriteria(eos_ids=frozenset({tok.eos_token_id}))
    ours = OnnxBackend(out)
    accepted = 0
    for prompt, got in zip(prompts, tokens):
        params = SamplingParams(max_tokens=max_new)
        ref = generate_one(target, prompt, params, None, stop).token_ids
        assert got == ref
        gen = lattice_generate(ours, prompt, params, stop)
        assert gen.token_ids == ref
        accepted += sum(n - 1 for n in gen.acceptance_lengths)
    assert stats["draft_tokens_proposed"] > 0 and stats["draft_tokens_accepted"] == accepted
