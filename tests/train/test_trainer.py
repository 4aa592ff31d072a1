"""Training writes loadable published checkpoints, lowers the loss, resumes, and stays lossless."""

import dataclasses
import json

import pytest
import torch

from blockdraft.checkpoints.publish import new_drafter
from blockdraft.cli import main
from decode_oracle import generate_one
from blockdraft.loading import load_drafter
from blockdraft.sampling.params import SamplingParams
from blockdraft.train.losses import blocks_at, dflash_loss, dspark_loss
from blockdraft.train.trainer import TrainConfig, mean_acceptance, teacher_data, train
from conftest import ASSETS, random_prompts

PROMPTS = random_prompts(12, seed=31)
EVAL = random_prompts(3, seed=32)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_train_lowers_loss_and_writes_published_layout(target, tmp_path, kind):
    drafter = new_drafter(target, kind, num_layers=1, block_size=4, target_layer_ids=(0, 2), mask_token_id=126,
                          markov_rank=16)
    summary = train(drafter, target, PROMPTS, EVAL, TrainConfig(steps=60, lr=1e-2, new_tokens=32, warmup=2), tmp_path,
                    progress=False)
    losses = [h["loss"] for h in summary["history"]]
    assert sum(losses[-10:]) / 10 < 0.8 * sum(losses[:10]) / 10
    cfg = json.loads((tmp_path / "config.json").read_text())
    if kind == "dspark":
        assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["markov_rank"] == 16
        assert cfg["target_layer_ids"] == [0, 2]
    else:
        assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_config"]["target_layer_ids"] == [0, 2]
    loaded = load_drafter(tmp_path, target)
    assert loaded.config.kind == kind and not loaded.config.own_lm_head    # the target's head is reused
    for prompt in EVAL:
        ref = generate_one(target, prompt, SamplingParams(max_tokens=20)).token_ids
        assert generate_one(target, prompt, SamplingParams(max_tokens=20), loaded).token_ids == ref
    untrained = new_drafter(target, kind, num_layers=1, block_size=4, target_layer_ids=(0, 2), mask_token_id=126,
                            markov_rank=16)
    assert summary["validation_mean_al"] > mean_acceptance(target, untrained, EVAL, 32)   # training helped
    assert summary["validation_mean_al"] == pytest.approx(mean_acceptance(target, loaded, EVAL, 32), abs=0.15)
    assert json.loads((tmp_path / "training.json").read_text())["validation_mean_al"] == summary["validation_mean_al"]


def test_resume_continues_the_same_run(target, tmp_path):
    def run(steps, out):
        d = new_drafter(target, "dspark", 1, 4, (0, 2), 126, markov_rank=8, seed=1)
        return train(d, target, PROMPTS[:4], EVAL[:1], TrainConfig(steps=steps, save_every=5, new_tokens=16),
                     out, progress=False)["history"]

    straight = run(10, tmp_path / "a")
    run(5, tmp_path / "b")
    resumed = run(10, tmp_path / "b")
    assert len(resumed) == 10
    assert [round(h["loss"], 5) for h in resumed] == [round(h["loss"], 5) for h in straight]


def test_a_continued_run_draws_new_sequences():
    from blockdraft.train.trainer import drawn_sequences

    first = TrainConfig(steps=50, seqs_per_step=2)
    seen = {i for step in range(first.steps) for i in drawn_sequences(1000, step, first)}
    assert len(seen) == 100                                            # one epoch: no repeats
    later = dataclasses.replace(first, first_draw=first.steps * first.seqs_per_step)
    assert drawn_sequences(1000, 0, later) == drawn_sequences(1000, first.steps, first)
    assert not seen & {i for step in range(50) for i in drawn_sequences(1000, step, later)}


def test_dspark_loss_parts(target, drafters):
    drafter = drafters["dspark"]
    seq = teacher_data(target, PROMPTS[:1], 16, drafter.config.taps)[0]
    anchors = torch.tensor([3, 5, len(seq.ids) - 2])          # the last block runs past the sequence end
    block = blocks_at(drafter, seq.taps, seq.final, seq.ids, anchors, target.lm_head)
    assert block.weight.view(3, -1)[2].tolist() == [1.0] + [0.0] * (drafter.config.num_draft_tokens - 1)
    # a bf16 target's hidden states against an fp32 head (the train script's frozen fp32 copy)
    half = blocks_at(drafter, seq.taps, seq.final.bfloat16(), seq.ids, anchors, target.lm_head)
    assert torch.allclose(half.target_logits, block.target_logits, atol=0.05, rtol=0.02)
    parts = dspark_loss(drafter, block)
    assert float(parts["l1"]) > 0.05 and "confidence_bce" in parts and torch.isfinite(parts["loss"])
    # against a teacher equal to the drafter's own Markov-biased distribution the L1 term vanishes
    with torch.no_grad():
        own = drafter.logits(block.hidden).float() + drafter.markov_head(block.prev)[0]
    same = dspark_loss(drafter, dataclasses.replace(block, target_logits=own))
    assert float(same["l1"]) < 1e-5 and float(same["ce"]) == pytest.approx(float(parts["ce"]), rel=1e-5)
    flash = drafters["dflash"]
    flash_seq = teacher_data(target, PROMPTS[:1], 16, flash.config.taps)[0]
    assert torch.isfinite(dflash_loss(flash, blocks_at(flash, flash_seq.taps, None, flash_seq.ids, anchors))["loss"])


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_position_gamma_weighs_the_slots(target, drafters, kind):
    """Slot k weighs exp(-k / gamma): gamma = inf is the plain mean over slots, and a small gamma
    is (nearly) the first slot's loss alone."""
    from torch.nn import functional as F

    drafter = drafters[kind]
    seq = teacher_data(target, PROMPTS[:1], 16, drafter.config.taps)[0]
    block = blocks_at(drafter, seq.taps, seq.final, seq.ids, torch.tensor([3, 5, 7]), target.lm_head)
    loss = dspark_loss if kind == "dspark" else dflash_loss
    z = drafter.logits(block.hidden).float()
    if kind == "dspark":
        z = z + drafter.markov_head(block.prev)[0]
    ce = F.cross_entropy(z, drafter.to_draft(block.labels).clamp_min(0), reduction="none")
    assert float(loss(drafter, block, gamma=float("inf"))["ce"]) == pytest.approx(float(ce.mean()), rel=1e-5)
    first = block.slot == 0
    assert float(loss(drafter, block, gamma=1e-3)["ce"]) == pytest.approx(float(ce[first].mean()), rel=1e-4)
    assert float(loss(drafter, block)["ce"]) != pytest.approx(float(ce.mean()), rel=1e-3)   # default: 4


@pytest.mark.parametrize("name", ["dflash", "dspark", "dflash-sliding"])
def test_batched_training_blocks_equal_the_inference_path(target, drafters, name):
    """All anchors of a sequence at once (training) == one anchor at a time through a KV cache (runtime)."""
    drafter = drafters[name]
    cfg = drafter.config
    seq = teacher_data(target, PROMPTS[:1], 24, cfg.taps)[0]
    anchors = torch.tensor([1, 4, 9, 17])
    block = blocks_at(drafter, seq.taps, seq.final, seq.ids, anchors, target.lm_head)
    first = 0 if cfg.shift_label else 1
    for i, a in enumerate(anchors.tolist()):
        cache = drafter.new_cache(1, a + cfg.block_size)
        drafter.extend_context(seq.taps[:, :a], cache)
        ref = drafter.block_hidden(seq.ids[a:a + 1], cfg.block_size, cache)[0, first:first + cfg.num_draft_tokens]
        n = cfg.num_draft_tokens
        torch.testing.assert_close(block.hidden[i * n:(i + 1) * n], ref, atol=2e-2, rtol=2e-2)
        assert block.labels[i * n].item() == seq.ids[a + 1].item()
    full = target.logits(seq.ids)[0]
    torch.testing.assert_close(block.target_logits[0], full[anchors[0]].float(), atol=2e-2, rtol=2e-2)


def test_teacher_data_stops_at_eos(target):
    eos = 5
    seqs = teacher_data(target, PROMPTS[:6], 40, (0, 2), eos_ids=frozenset({eos}), max_batch=4)
    for prompt, seq in zip(PROMPTS[:6], seqs):
        response = seq.ids[len(prompt):].tolist()
        ref = generate_one(target, prompt, SamplingParams(max_tokens=40, ignore_eos=True)).token_ids
        cut = ref.index(eos) + 1 if eos in ref else len(ref)
        assert response == ref[:cut] and seq.response_start == len(prompt)
        assert seq.taps.shape == (1, len(seq.ids), 2 * target.config.hidden_size)


def target_for_cli():
    from blockdraft.loading import load_target

    return load_target(ASSETS / "target-qwen3")


def test_train_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path / "cache-root"))       # the teacher cache goes there
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(["hello world", "abc def", "the quick fox", "jumps over", "lazy dog"] * 2))
    out = tmp_path / "drafter"
    assert main(["train", "--target", str(ASSETS / "target-qwen3"), "--kind", "dspark", "--prompts", str(prompts),
                 "--out", str(out), "--taps", "0,2", "--steps", "6", "--block-size", "4", "--markov-rank", "8",
                 "--new-tokens", "12"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    record = json.loads((out / "training.json").read_text())
    assert [h["step"] for h in record["history"]][-1] == 6 and report["final_loss"] == record["history"][-1]["loss"]
    assert report["validation_mean_al"] == record["validation_mean_al"] and (out / "model.safetensors").is_file()
    assert load_drafter(out, target_for_cli()).config.tap_point == "layer_output"   # DSpark trains on raw outputs
    assert len(list((tmp_path / "cache-root" / "teacher-cache").glob("*/manifest.json"))) == 1
    assert main(["train", "--target", str(ASSETS / "target-qwen3"), "--prompts", str(tmp_path / "nope.txt"),
                 "--out", str(out), "--taps", "0"]) == 2
    capsys.readouterr()
    assert main(["train", "--target", str(ASSETS / "target-qwen3"), "--prompts", str(prompts), "--out",
                 str(tmp_path / "d2"), "--taps", "0", "--schedule", "cosine", "--seqs-per-step", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("seqs_per_step must be >= 1, got 0")


def test_train_cli_builtin_prompts(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path / "cache-root"))
    out = tmp_path / "drafter"
    assert main(["train", "--target", str(ASSETS / "target-qwen3"), "--kind", "dflash", "--prompts", "builtin:8",
                 "--out", str(out), "--taps", "0,2", "--steps", "2", "--block-size", "4", "--new-tokens", "8"]) == 0
    assert (out / "model.safetensors").is_file()
    assert main(["train", "--target", str(ASSETS / "target-qwen3"), "--prompts", "builtin:x", "--out", str(out),
                 "--taps", "0"]) == 2
    assert "builtin:N needs an integer" in capsys.readouterr().err


def test_builtin_prompt_sources_are_offline_and_deterministic():
    from blockdraft.train.prompts import stdlib_code, templated_math

    assert stdlib_code(20, seed=1) == stdlib_code(20, seed=1) and len(stdlib_code(20)) == 20
    assert templated_math(10, seed=2) == templated_math(10, seed=2)
    assert all("Python" in p or "`" in p for p in stdlib_code(20))


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "ok"}\n{"prompt": 3}\n', r"prompts\.jsonl:2: needs a string field 'prompt'"),
    ('{"prompt": "ok"}\n\n{"text": "x"}\n', r"prompts\.jsonl:3: needs a string field 'prompt'"),
    ('{"prompt": "ok"}\nnot json\n', r"prompts\.jsonl:2: not a JSON object"),
])
def test_bad_training_prompts_are_one_line_errors(tmp_path, capsys, content, message):
    import re

    bad = tmp_path / "prompts.jsonl"
    bad.write_text(content)
    assert main(["train", "--target", str(ASSETS / "target-qwen3"), "--prompts", str(bad), "--out",
                 str(tmp_path / "d"), "--taps", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert not (tmp_path / "d").exists()


def test_teacher_data_without_a_response_is_a_named_error(target, tmp_path):
    from blockdraft.errors import RequestError
    from blockdraft.train.trainer import TeacherSeq, fit

    drafter = new_drafter(target, "dflash", 1, 4, (0, 2), 126)
    ids = torch.tensor([5, 6])
    short = [TeacherSeq(ids, torch.zeros(1, 2, 2 * target.config.hidden_size), torch.zeros(2, 64), 2)]
    with pytest.raises(RequestError, match="none of the 1 teacher sequences has a response token"):
        fit(drafter, short, TrainConfig(steps=1), None, progress=False)


def test_lattice_backend_refuses_a_context_gap(target, drafters):
    from lattice_oracle import TorchLatticeBackend

    backend = TorchLatticeBackend(target, drafters["dspark"])
    taps = torch.zeros(3, 2 * target.config.hidden_size)
    with pytest.raises(RuntimeError, match="drafter context holds 0 rows, new rows start at 2"):
        backend.draft(taps, 2, [1] * drafters["dspark"].config.block_size)


def test_dspark_loss_without_target_logits_is_a_named_error(target, drafters):
    from blockdraft.errors import ConfigError

    drafter = drafters["dspark"]
    seq = teacher_data(target, PROMPTS[:1], 16, drafter.config.taps)[0]
    block = blocks_at(drafter, seq.taps, seq.final, seq.ids, torch.tensor([3, 5]))      # no head: no logits
    with pytest.raises(ConfigError, match="dspark_loss needs the target.s distribution"):
        dspark_loss(drafter, block)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_teacher_forcing_recomputes_the_runtime_taps(dtype):
    """Training taps come from one teacher-forced pass over prompt + response, padded beside a longer
    sequence; the runtime computes them in a prefill and then verify blocks of varying size. In bf16
    (the default numerics) they must be the same bits; fp32 MKL GEMMs are not row-invariant."""
    from blockdraft.loading import load_target
    from blockdraft.train.trainer import TeacherSeq, _joint_taps, _taps_for, teacher_force

    target = load_target(ASSETS / "target-qwen3", dtype=dtype)
    g = torch.Generator().manual_seed(5)
    ids, other = torch.randint(0, 124, (70,), generator=g), torch.randint(0, 124, (90,), generator=g)
    flash = new_drafter(target, "dflash", 1, 4, (1, 3), 126)                 # last layer at hidden_states
    spark = new_drafter(target, "dspark", 1, 4, (0, 3), 126, markov_rank=4)  # ... and at layer_output
    joint = _joint_taps({"a": flash, "b": spark}, target)
    forced = teacher_force(target, [TeacherSeq(ids, None, None, 20), TeacherSeq(other, None, None, 20)], joint)[0]
    cache = target.new_cache(1, 80)
    for drafter in (flash, spark):
        out = target(ids[None, :20], cache, drafter.config.taps, logits_rows=1)
        cache.truncate(20)
        rows, start = [out.taps], 20
        for size in (1, 5, 3, 9, 2, 7, 1, 8, 4, 10):                          # verify blocks as decoding sends them
            rows.append(target(ids[None, start:start + size], cache, drafter.config.taps).taps)
            start += size
            cache.truncate(start)
        runtime = torch.cat(rows, dim=1)                                        # [1, 70, F]
        trained = _taps_for(drafter, forced, joint, target.config.num_layers - 1)
        if dtype == torch.bfloat16:
            assert torch.equal(trained, runtime)
        else:
            torch.testing.assert_close(trained, runtime, rtol=1e-5, atol=1e-5)
        cache.truncate(0)
    assert not torch.equal(_taps_for(flash, forced, joint, 3)[..., -64:], forced.taps[..., -64:])  # the norm differs


def test_train_cli_refuses_dflash2_by_name(tmp_path, capsys):
    assert main(["train", "--target", str(ASSETS / "target-qwen3"), "--kind", "dflash2", "--prompts", "builtin:8",
                 "--out", str(tmp_path / "d"), "--taps", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dflash2" in err[0] and not (tmp_path / "d").exists()


def test_train_cli_exposes_the_recipe_knobs(tmp_path, capsys):
    """The knobs the shipped drafters' recipe uses: warmup, slot weighting, seed, checkpoint cadence, mask
    token, threads and a pruned draft vocabulary (the most frequent teacher-response ids)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(["hello world", "abc def", "the quick fox", "jumps over", "lazy dog"] * 2))
    out = tmp_path / "drafter"
    assert main(["train", "--target", str(ASSETS / "target-qwen3"), "--kind", "dspark", "--prompts", str(prompts),
                 "--out", str(out), "--taps", "0,2", "--steps", "4", "--block-size", "4", "--markov-rank", "8",
                 "--new-tokens", "12", "--warmup", "2", "--position-gamma", "2", "--seed", "3", "--schedule", "cosine",
                 "--blocks-per-seq", "3", "--top-k", "8", "--cache-dir", str(tmp_path / "cache"),
                 "--mask-token-id", "7", "--threads", "1", "--draft-vocab", "40", "--quiet"]) == 0
    record = json.loads((out / "training.json").read_text())
    config = record["config"]
    assert (config["warmup"], config["position_gamma"], config["seed"], config["schedule"]) == (2, 2.0, 3, "cosine")
    assert config["blocks_per_seq"] == 3 and all(h["blocks"] <= 3 * 2 for h in record["history"])
    assert json.loads((tmp_path / "cache" / "manifest.json").read_text())["top_k"] == 8   # the cache is outside --out
    drafter = load_drafter(out, target_for_cli()).config
    assert drafter.mask_token_id == 7 and drafter.draft_vocab_size == 40
