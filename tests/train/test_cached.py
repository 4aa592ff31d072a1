"""Training from the teacher cache: top-k losses agree with the full-distribution ones, a step
takes every response position, training lowers the loss, and an interrupted run resumes bit for bit."""

import dataclasses

import pytest
import torch

from blockdraft.checkpoints.publish import new_drafter
from blockdraft.train.cached import CachedTrainConfig, anchors_for, drawn, fit_cached, lr_scale
from blockdraft.train.evaluate import Trigram, forced_acceptance
from blockdraft.train.losses import TopK, blocks_at, dspark_loss, topk_l1, with_topk
from blockdraft.train.shards import Conversation, write_shard
from blockdraft.train.tap_cache import TapCache, build, spec_for
from blockdraft.train.trainer import teacher_responses
from conftest import random_prompts

TAPS = (0, 2)


@pytest.fixture(scope="module")
def cache(target, tmp_path_factory):
    """Eight sequences: random prompts and the tiny target's greedy responses, cached with top-16."""
    root = tmp_path_factory.mktemp("cached")
    prompts = random_prompts(8, seed=61, low=4, high=10)
    responses = teacher_responses(target, prompts, 24)
    write_shard(root / "teacher", "a", "self_instruct", "test",
                [Conversation(p, r) for p, r in zip(prompts, responses)], {"model": "tiny"})
    spec = spec_for(target, root / "teacher", TAPS, 16, {"model": "tiny"})
    return TapCache.open(build(target, root / "teacher", root / "cache", spec), spec)


def tiny(target, kind, vocab=None, seed=1):
    return new_drafter(target, kind, 1, 4, TAPS, 126, markov_rank=8, seed=seed, draft_vocab=vocab).float()


@pytest.mark.parametrize("pruned", [False, True])
def test_topk_l1_is_exact_with_every_id_and_bounded_with_fewer(target, pruned):
    drafter = tiny(target, "dspark", torch.arange(0, 128, 2) if pruned else None)
    vd, v = drafter.config.output_vocab_size, target.config.vocab_size
    g = torch.Generator().manual_seed(0)
    draft_probs = torch.softmax(torch.randn(5, vd, generator=g) * 3, -1)
    target_probs = torch.softmax(torch.randn(5, v, generator=g) * 3, -1)
    full = drafter.to_target_vocab(draft_probs)                                       # [5, V], 0 off the draft vocab
    exact = (full - target_probs).abs().sum(-1)
    probs, ids = target_probs.topk(v, dim=-1)
    torch.testing.assert_close(topk_l1(drafter, draft_probs, TopK(ids, probs)), exact)
    probs, ids = target_probs.topk(8, dim=-1)
    approx = topk_l1(drafter, draft_probs, TopK(ids, probs))
    rest_target = 1 - probs.sum(-1)
    rest_draft = 1 - full.gather(1, ids).sum(-1)
    assert (approx <= exact + 1e-6).all()
    assert (approx >= exact - 2 * torch.minimum(rest_target, rest_draft) - 1e-6).all()
    assert not torch.allclose(approx, exact)                                         # k = 8 does lose something


def test_dspark_loss_from_topk_equals_the_full_distribution(target, cache):
    drafter = tiny(target, "dspark")
    seq = cache.seq(0)
    anchors = torch.tensor([seq.anchor_range[0], seq.anchor_range[0] + 3, len(seq.ids) - 2])
    taps = cache.taps_for(seq, TAPS, "layer_output", target.config.num_layers - 1)
    block = blocks_at(drafter, taps, None, seq.ids, anchors)
    with torch.no_grad():
        logits = target(seq.ids[None]).logits[0].float()                             # [L, V]
    v = logits.shape[-1]
    probs, ids = torch.softmax(logits, -1).topk(v, dim=-1)
    full = with_topk(block, anchors, len(seq.ids), ids, probs)
    rows = ((anchors[:, None] + 1 + torch.arange(4)).clamp(max=len(seq.ids) - 1) - 1).reshape(-1)
    ref = dataclasses.replace(block, target_logits=logits[rows])
    a, b = dspark_loss(drafter, full), dspark_loss(drafter, ref)
    for key in ("loss", "ce", "l1", "confidence_bce"):
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-5)
    cached = with_topk(block, anchors, len(seq.ids), seq.topk_ids, seq.topk_probs)   # the cache's top-16
    torch.testing.assert_close(cached.target_topk.probs, full.target_topk.probs[:, :16])


@pytest.mark.parametrize("pruned, bf16", [(False, False), (True, False), (True, True)])
def test_the_chunked_dspark_loss_gives_autograds_values_and_gradients(target, cache, monkeypatch, pruned, bf16):
    """`head_loss.draft_head_loss` (row chunks, gradients formed in the forward pass) against autograd over
    the same expression (`dspark_loss`'s reference path): loss parts and every parameter's gradient, with
    chunks of 5 rows so that chunk edges and a short last chunk are crossed."""
    from blockdraft.train import head_loss, losses

    monkeypatch.setattr(head_loss.draft_head_loss, "__defaults__", (torch.float32, torch.float32, 5))
    calls = []
    monkeypatch.setattr(losses, "draft_head_loss", lambda *a, **k: calls.append(1) or head_loss.draft_head_loss(*a, **k))
    drafter = tiny(target, "dspark", torch.arange(0, 128, 2) if pruned else None)
    seq = cache.seq(1)
    anchors = torch.arange(seq.anchor_range[0], len(seq.ids) - 1, 2)
    taps = cache.taps_for(seq, TAPS, "layer_output", target.config.num_layers - 1)
    runs = {}
    for path in ("chunked", "reference"):
        if path == "reference":
            monkeypatch.setattr(losses, "_plain_head", lambda *_: False)
        drafter.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            block = with_topk(blocks_at(drafter, taps, None, seq.ids, anchors), anchors, len(seq.ids),
                              seq.topk_ids, seq.topk_probs)
            parts = dspark_loss(drafter, block)
        parts["loss"].backward()
        assert len(calls) == 1, f"{path}: the chunked loss ran {len(calls)} times, expected once over both runs"
        runs[path] = ({k: v.detach() for k, v in parts.items()},
                      {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None})
    (parts, grads), (ref_parts, ref_grads) = runs["chunked"], runs["reference"]
    assert len(anchors) * 4 > 5 * 3 and grads.keys() == ref_grads.keys()
    assert {"lm_head.weight", "markov_head.markov_w2.weight", "markov_head.markov_w1.weight"} <= grads.keys() \
        or not pruned
    tol = dict(atol=2e-3, rtol=2e-2) if bf16 else dict(atol=1e-5, rtol=1e-4)
    for key in ("loss", "ce", "l1", "confidence_bce"):
        torch.testing.assert_close(parts[key], ref_parts[key], **tol)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("bf16", [False, True])
def test_blocks_read_the_shared_context_once_with_the_fused_kernels_values_and_gradients(target, cache, monkeypatch,
                                                                                       bf16):
    """Training attends over the context K/V once for all of a sequence's blocks
    (`drafter.attend_shared_context`); the loss and every gradient equal the fused kernel's over the
    context copied per block."""
    from blockdraft.models import drafter as drafter_module

    seq = cache.seq(1)
    anchors = torch.arange(seq.anchor_range[0], len(seq.ids) - 1)
    taps = cache.taps_for(seq, TAPS, "layer_output", target.config.num_layers - 1)
    calls = []
    shared = drafter_module.shared_context
    monkeypatch.setattr(drafter_module, "shared_context", lambda *a: calls.append(shared(*a)) or calls[-1])

    def loss_and_grads():
        drafter = tiny(target, "dspark").train().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            block = with_topk(blocks_at(drafter, taps, None, seq.ids, anchors), anchors, len(seq.ids),
                              seq.topk_ids, seq.topk_probs)
            loss = dspark_loss(drafter, block)["loss"]
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in drafter.named_parameters() if p.grad is not None}

    once, grads = loss_and_grads()
    assert calls and all(calls)                                  # every layer took the shared-context path
    monkeypatch.setattr(drafter_module, "shared_context", lambda *a: False)
    copied, ref = loss_and_grads()
    tol = dict(atol=2e-2, rtol=2e-2) if bf16 else dict(atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(once, copied, **tol)
    assert grads.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(grads[name], ref[name], **tol, msg=name)


def test_a_step_draws_every_response_position_and_every_sequence_once_an_epoch(cache):
    cfg = CachedTrainConfig(steps=10, seqs_per_step=2)
    seen = [i for step in range(4) for i in drawn(len(cache), step, cfg)]
    assert sorted(seen) == list(range(8))
    seq = cache.seq(3)
    lo, hi = seq.anchor_range
    assert anchors_for(seq, 0, 0, cfg).tolist() == list(range(lo, hi)) and lo == seq.response_start - 1
    some = dataclasses.replace(cfg, blocks_per_seq=5)
    picked = anchors_for(seq, 7, 1, some)
    assert len(picked) == 5 and torch.equal(picked, anchors_for(seq, 7, 1, some))    # seeded by step
    assert not torch.equal(picked, anchors_for(seq, 8, 1, some))


def test_schedules():
    constant = CachedTrainConfig(steps=100, warmup=10)
    assert lr_scale(0, constant) == pytest.approx(0.1) and lr_scale(50, constant) == lr_scale(99, constant) == 1.0
    cosine = dataclasses.replace(constant, schedule="cosine")
    assert lr_scale(10, cosine) == pytest.approx(1.0) and lr_scale(99, cosine) == pytest.approx(0.1, abs=1e-3)


@pytest.mark.parametrize("field, value", [("steps", 0), ("seqs_per_step", 0), ("blocks_per_seq", -1),
                                          ("schedule", "linear"), ("lr", 0.0), ("save_every_seconds", 0)])
def test_config_names_bad_fields(field, value):
    with pytest.raises(ValueError, match=field):
        CachedTrainConfig(**{"steps": 10, field: value})


@pytest.mark.parametrize("kind", ["dspark", "dflash"])
def test_training_from_the_cache_lowers_the_loss_and_raises_acceptance(target, cache, tmp_path, kind):
    drafter = tiny(target, kind)
    last = target.config.num_layers - 1
    before = forced_acceptance(drafter, cache, list(range(8)), last)
    cfg = CachedTrainConfig(steps=32, lr=2e-2, warmup=2, seqs_per_step=2)
    state = fit_cached({kind: drafter}, cache, cfg, tmp_path / "state.pt", last)
    losses = [h["loss"] for h in state.history[kind]]
    assert sum(losses[-8:]) / 8 < 0.7 * sum(losses[:8]) / 8
    after = forced_acceptance(drafter, cache, list(range(8)), last)
    assert after.mean_al > before.mean_al and after.anchors == before.anchors > 0
    assert state.history[kind][0]["blocks"] == sum(len(anchors_for(cache.seq(i), 0, j, cfg))
                                                   for j, i in enumerate(drawn(len(cache), 0, cfg)))


def test_an_interrupted_run_resumes_bit_for_bit(target, cache, tmp_path):
    last = target.config.num_layers - 1
    cfg = CachedTrainConfig(steps=6, lr=1e-2, warmup=2, seqs_per_step=2, blocks_per_seq=6)

    def fresh():
        return {"dspark": tiny(target, "dspark"), "dflash": tiny(target, "dflash")}

    straight = fresh()
    fit_cached(straight, cache, cfg, tmp_path / "a.pt", last)
    resumed = fresh()
    first = fit_cached(resumed, cache, cfg, tmp_path / "b.pt", last, stop_at=3)
    assert first.step == 3
    resumed = fresh()                                                   # a new process: weights from the file
    second = fit_cached(resumed, cache, cfg, tmp_path / "b.pt", last)
    assert second.step == 6
    for kind in straight:
        for (name, a), b in zip(straight[kind].state_dict().items(), resumed[kind].state_dict().values()):
            assert torch.equal(a, b), f"{kind}.{name}"
    with pytest.raises(ValueError, match="lr=0.01 is stored here, not lr=0.02"):
        fit_cached(fresh(), cache, dataclasses.replace(cfg, lr=2e-2), tmp_path / "b.pt", last)


def test_trigram_floor_counts_continuations():
    cycle = [5, 6, 7, 8, 9] * 6
    table = Trigram([(cycle, 3)])
    assert table.acceptance([(cycle, 3)], 4).mean_al == pytest.approx(5.0)           # every block right
    other = Trigram([([1, 2, 3, 4] * 6, 3)])
    assert other.acceptance([(cycle, 3)], 4).mean_al == pytest.approx(1.0)
