"""A pruned draft vocabulary (speculators / EAGLE-3 spelling: draft_vocab_size, d2t, t2d)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from blockdraft.checkpoints.publish import prune_vocabulary, save_drafter
from decode_oracle import generate_one
from blockdraft.errors import CheckpointError, ConfigError
from blockdraft.llm import LLM
from blockdraft.loading import load_drafter
from blockdraft.sampling.params import SamplingParams
from blockdraft.train.losses import blocks_at, dflash_loss, dspark_loss
from blockdraft.train.trainer import teacher_data
from blockdraft.train.vocab import choose_draft_vocab, token_counts
from conftest import ASSETS, random_prompts

PROMPTS = random_prompts(4, seed=71)
PRUNED = ("dflash-speculators", "dspark-pruned")


def _run(target, drafter, params):
    out = [generate_one(target, p, params, drafter) for p in PROMPTS]
    return [g.token_ids for g in out], [g.acceptance_lengths for g in out]


@pytest.mark.parametrize("name", ["dflash", "dflash2", "dspark"])
def test_whole_vocabulary_prune_equals_the_unpruned_drafter(target, drafters, name):
    full = drafters[name]
    pruned = prune_vocabulary(full, target, torch.arange(full.config.vocab_size))
    assert pruned.config.draft_vocab_size == full.config.vocab_size and pruned.config.own_lm_head
    for params in (SamplingParams(max_tokens=24), SamplingParams(max_tokens=24, temperature=1.0, seed=5)):
        assert _run(target, pruned, params) == _run(target, full, params)


@pytest.mark.parametrize("name", ["dflash", "dspark"])
def test_pruned_losses_equal_unpruned_on_the_whole_vocabulary(target, drafters, name):
    full = drafters[name]
    pruned = prune_vocabulary(full, target, torch.arange(full.config.vocab_size))
    seq = teacher_data(target, PROMPTS[:1], 16, full.config.taps)[0]
    anchors = torch.tensor([len(PROMPTS[0]), len(PROMPTS[0]) + 4])
    loss = dspark_loss if name == "dspark" else dflash_loss
    a = loss(full, blocks_at(full, seq.taps, seq.final, seq.ids, anchors, target.lm_head))
    b = loss(pruned, blocks_at(pruned, seq.taps, seq.final, seq.ids, anchors, target.lm_head))
    assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-5)


@pytest.mark.parametrize("name", PRUNED)
def test_pruned_fixtures_are_lossless_and_accept(target, name):
    drafter = load_drafter(ASSETS / name, target)
    assert 0 < drafter.config.draft_vocab_size < drafter.config.vocab_size
    assert drafter.logits(torch.zeros(1, drafter.config.hidden_size)).shape[-1] == drafter.config.draft_vocab_size
    lengths = []
    for prompt in PROMPTS:
        ref = generate_one(target, prompt, SamplingParams(max_tokens=32)).token_ids
        gen = generate_one(target, prompt, SamplingParams(max_tokens=32), drafter)
        assert gen.token_ids == ref
        lengths += gen.acceptance_lengths
        kept = drafter.t2d
        sampled = generate_one(target, prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=3), drafter)
        assert len(sampled.token_ids) == 16 and all(0 <= t < len(kept) for t in sampled.token_ids)
    assert max(lengths) > 1, "the pruned fixture never had a draft accepted: the comparison is vacuous"


def test_pruned_drafter_runs_in_the_engine(target):
    llm = LLM(target=str(ASSETS / "target-qwen3"), drafter=str(ASSETS / "dspark-pruned"), dtype="float32",
              max_batch=4, adaptive_speculation=False)
    plain = LLM(target=str(ASSETS / "target-qwen3"), drafter="none", dtype="float32", max_batch=4)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    spec = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain.generate(prompt_token_ids=PROMPTS,
                                                                               sampling_params=params)]
    assert sum(o.accepted for o in spec) > 0, "no pruned draft was accepted: its ids never reached the target's"
    assert max(a for o in spec for a in o.acceptance_lengths) > 1


def test_speculators_layout_is_read(target):
    cfg = json.loads((ASSETS / "dflash-speculators" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dflash" and "transformer_layer_config" in cfg
    d = load_drafter(ASSETS / "dflash-speculators", target)
    assert d.config.kind == "dflash" and d.config.target_layer_ids == (0, 2) and d.config.num_layers == 2
    assert d.config.draft_vocab_size == cfg["draft_vocab_size"] == int(d.t2d.sum())
    ids = d.to_target(torch.arange(d.config.draft_vocab_size))
    assert torch.equal(d.to_draft(ids), torch.arange(d.config.draft_vocab_size))
    assert bool((d.to_draft(torch.nonzero(~d.t2d)[:, 0]) == -1).all())


def test_save_and_reload_keep_the_map(target, tmp_path):
    d = load_drafter(ASSETS / "dspark-pruned", target)
    save_drafter(d, target, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["draft_vocab_size"] == d.config.draft_vocab_size
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert tensors["d2t"].dtype == torch.long and tensors["t2d"].dtype == torch.bool
    again = load_drafter(tmp_path, target)
    assert _run(target, again, SamplingParams(max_tokens=16)) == _run(target, d, SamplingParams(max_tokens=16))


def _damaged(tmp_path, edit):
    src = ASSETS / "dspark-pruned"
    tensors = load_file(str(src / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    edit(tensors, cfg)
    tmp_path.mkdir(exist_ok=True)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def _flip_one(t, c):
    t2d = t["t2d"].clone()
    t2d[int(torch.nonzero(~t2d)[0, 0])] = True
    t2d[int(torch.nonzero(t2d)[0, 0])] = False
    t["t2d"] = t2d


@pytest.mark.parametrize("edit, error, message", [
    (lambda t, c: t.pop("t2d"), ConfigError, r"need both d2t and t2d"),
    (lambda t, c: c.update(draft_vocab_size=95), ConfigError, r"draft_vocab_size=95 in config but d2t has 96"),
    (lambda t, c: t.update({"t2d": t["t2d"].clone().fill_(True)}), ConfigError, r"t2d marks 128 target ids but "
                                                                                 r"draft_vocab_size=96"),
    (_flip_one, ConfigError, r"d2t and t2d disagree at draft id"),
    (lambda t, c: t.update({"lm_head.weight": t["lm_head.weight"][:90]}), ConfigError,
     r"lm_head.weight has 90 rows but the draft vocabulary \(d2t\) has 96"),
    (lambda t, c: t.update({"markov_head.markov_w2.weight": t["markov_head.markov_w2.weight"][:90]}),
     CheckpointError, r"markov_w2.weight has shape \(90, 16\)"),
])
def test_bad_vocabulary_maps_are_named(target, tmp_path, edit, error, message):
    with pytest.raises(error, match=message):
        load_drafter(_damaged(tmp_path / "d", edit), target)


def test_draft_vocab_choice_by_frequency():
    counts = token_counts([[3, 3, 3, 5, 5, 1], [5, 7]], vocab_size=10)
    vocab = choose_draft_vocab(counts, 3, always=[9])
    assert vocab.ids.tolist() == [3, 5, 9]
    assert vocab.coverage == pytest.approx(6 / 8) and vocab.counted_tokens == 8
    assert choose_draft_vocab(counts, 4).ids.tolist() == [1, 3, 5, 7]       # ties: lower id first
    with pytest.raises(Exception, match="smaller than the 2 ids it must keep"):
        choose_draft_vocab(counts, 1, always=[0, 1])
