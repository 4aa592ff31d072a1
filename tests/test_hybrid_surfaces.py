"""Every state-keeping target family (Qwen3.5, LFM2, gpt-oss, Gemma 4 MoE) through every surface: `generate`
(CLI and `LLM`), `serve` with the official openai client, `bench` and `train`; `--tp` and `export onnx`
refuse them with one named line."""

import json

import pytest
from openai import OpenAI

import hybrid_models as hm
from blockdraft.cli import main
from blockdraft.llm import LLM
from blockdraft.sampling.params import SamplingParams
from blockdraft.server.thread import ServerThread
from server.server_harness import API_KEY, MODEL


FAMILIES = [("qwen3_5", False), ("lfm2", False), ("gpt_oss", False), ("gemma4", True)]      # (arch, moe)


@pytest.fixture(scope="module", params=FAMILIES, ids=[a for a, _ in FAMILIES])
def family(request):
    return request.param[0]


@pytest.fixture(scope="module")
def dirs(hybrid_root, family):
    moe = dict(FAMILIES)[family]
    return (str(hm.checkpoint(str(hybrid_root), moe, arch=family)),
            str(hm.trained_drafter_dir(str(hybrid_root), "dspark", moe, family)))


def _generate(capsys, target, drafter, *extra) -> dict:
    assert main(["generate", "--target", target, "--drafter", drafter, "--prompt-ids", "5,17,3,88,41,9",
                 "--max-new-tokens", "16", "--ignore-eos", "--dtype", "bfloat16", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_cli_and_llm(capsys, dirs, family):
    target, drafter = dirs
    spec = _generate(capsys, target, drafter, "--no-adaptive-speculation")
    plain = _generate(capsys, target, "none")
    assert spec["token_ids"] == plain["token_ids"] and len(spec["token_ids"]) == 16
    assert max(spec["acceptance_lengths"]) > 1
    assert spec["target"]["architecture"] == family
    assert f"refused for {family}" in spec["target"]["prefix_caching"]
    llm = LLM(target=target, drafter=drafter, dtype="bfloat16", max_batch=4, adaptive_speculation=False)
    outs = llm.generate(prompt_token_ids=[[5, 17, 3, 88, 41, 9], [7, 7, 2]],
                        sampling_params=SamplingParams(max_tokens=16, ignore_eos=True))
    assert outs[0].token_ids == spec["token_ids"] and outs[0].acceptance_lengths == spec["acceptance_lengths"]


@pytest.mark.parametrize("args,message", [
    (["generate", "--tp", "2", "--prompt-ids", "1,2"], "--tp 2: {} targets"),
    (["export", "onnx", "--out", "OUT"], "export onnx: {} targets are not exported"),
])
def test_tp_and_onnx_export_refuse_hybrid_targets(capsys, dirs, family, tmp_path, args, message):
    target, drafter = dirs
    message = message.format(family)
    args = [a.replace("OUT", str(tmp_path / "x")) for a in args]
    assert main([*args, "--target", target, "--drafter", drafter]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_serve_with_the_openai_client(dirs, family):
    target, drafter = dirs
    llm = LLM(target=target, drafter=drafter, dtype="bfloat16", max_batch=4)
    plain = LLM(target=target, drafter=None, dtype="bfloat16", max_batch=1)
    with ServerThread(llm, MODEL, API_KEY) as srv:
        client = OpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY)
        r = client.completions.create(model="tiny", prompt="hello world", max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True})
        import httpx
        metrics = httpx.get(f"{srv.url}/metrics").text
    ref = plain.generate(["hello world"], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert r.choices[0].text == ref.text and r.usage.completion_tokens == 12
    line = next(x for x in metrics.splitlines() if x.startswith("blockdraft_prefix_caching_enabled{"))
    assert f"refused for {family}" in line and line.endswith(" 0.0")


def test_bench_and_train_run_hybrid_targets(dirs, tmp_path):
    target, drafter = dirs
    assert main(["bench", "--target", target, "--drafters", f"dspark={drafter}", "--sets", "chat", "--quick", "--no-hf",
                 "--temperatures", "0", "--batch-sizes", "2", "--dtype", "bfloat16", "--max-new-tokens", "8", "--repeats", "1",
                 "--out", str(tmp_path / "bench")]) == 0
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    for modes in report["results"]["chat"].values():
        assert modes["dspark"]["greedy_matches_ar"] == 2 and modes["ar"]["tokens"] == modes["dspark"]["tokens"]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\nthe cat sat\none two three\n")
    assert main(["train", "--target", target, "--kind", "dspark", "--taps", "1,3", "--prompts", str(prompts), "--steps", "3",
                 "--new-tokens", "8", "--out", str(tmp_path / "drafter"), "--quiet"]) == 0
    assert (tmp_path / "drafter" / "config.json").is_file()


def test_generate_json_names_the_multimodal_tensors_set_aside(capsys, hybrid_root):
    """A published Gemma 4 (vision and audio towers beside the text decoder) generates from its text
    decoder; `--json` counts what was not loaded."""
    target = str(hm.checkpoint(str(hybrid_root), True, True, arch="gemma4"))
    out = _generate(capsys, target, "none")
    skipped = out["target"]["skipped_tensors"]
    assert set(skipped) == {"model.vision_tower.*", "model.audio_tower.*", "model.embed_vision.*", "model.embed_audio.*"}
    assert all(n > 0 for n in skipped.values()) and len(out["token_ids"]) == 16
