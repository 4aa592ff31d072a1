"""The teacher cache holds what one teacher-forced pass computes, resumes its build by shard, and
refuses, by field, to serve a cache built for something else."""

import dataclasses
import json

import pytest
import torch

from blockdraft.config import Taps
from blockdraft.train.shards import Conversation, write_shard
from blockdraft.train.tap_cache import TapCache, TapCacheError, build, spec_for
from conftest import random_prompts

TARGET_ID = {"model": "tiny-qwen3", "dtype": "float32"}


def teacher_dir(tmp_path, shards=("a", "b")):
    root = tmp_path / "teacher"
    for n, name in enumerate(shards):
        prompts = random_prompts(3, seed=40 + n, low=4, high=9)
        responses = random_prompts(3, seed=50 + n, low=6, high=14)
        write_shard(root, name, "templated_math" if n % 2 else "self_instruct", "test",
                    [Conversation(p, r) for p, r in zip(prompts, responses)], {"model": "tiny"})
    return root


def test_cache_holds_the_teacher_forced_pass(target, tmp_path):
    teacher = teacher_dir(tmp_path)
    spec = spec_for(target, teacher, (0, 2), 16, TARGET_ID)
    cache = TapCache.open(build(target, teacher, tmp_path / "cache", spec), spec)
    assert len(cache) == 6
    seq = cache.seq(4)                                                  # shard b, second conversation
    conv = Conversation(random_prompts(3, seed=41, low=4, high=9)[1], random_prompts(3, seed=51, low=6, high=14)[1])
    assert seq.ids.tolist() == conv.prompt + conv.response and seq.response_start == len(conv.prompt)
    with torch.no_grad():
        out = target(seq.ids[None], tap_layers=Taps((0, 2), "layer_output"))
    h = target.config.hidden_size
    assert torch.equal(seq.hidden[:, :2 * h], out.taps[0].bfloat16())
    assert torch.equal(seq.hidden[:, 2 * h:], out.hidden[0].bfloat16())          # the final hidden follows
    probs, ids = torch.softmax(out.logits[0].float(), -1).topk(16, dim=-1)
    assert torch.equal(seq.topk_ids.long(), ids)
    torch.testing.assert_close(seq.topk_probs, probs, atol=1e-6, rtol=1e-5)
    last = target.config.num_layers - 1
    assert torch.equal(cache.taps_for(seq, (0, last), "hidden_states", last)[0, :, h:], seq.hidden[:, 2 * h:])
    assert torch.equal(cache.taps_for(seq, (2, 0), "layer_output", last)[0], torch.cat(
        [seq.hidden[:, h:2 * h], seq.hidden[:, :h]], -1))
    with pytest.raises(TapCacheError, match="tap layer 1 is not cached"):
        cache.taps_for(seq, (1,), "layer_output", last)


def test_build_resumes_by_shard_and_takes_new_shards(target, tmp_path):
    teacher = teacher_dir(tmp_path, ("a",))
    spec = spec_for(target, teacher, (1,), 4, TARGET_ID)
    root = build(target, teacher, tmp_path / "cache", spec)
    stamp = (root / "a" / "hidden.npy").stat().st_mtime_ns
    teacher_dir(tmp_path, ("b",))                                       # the teacher data grows by a shard
    spec = spec_for(target, teacher, (1,), 4, TARGET_ID)
    build(target, teacher, root, spec)
    assert (root / "a" / "hidden.npy").stat().st_mtime_ns == stamp       # built shards are kept
    assert len(TapCache.open(root, spec)) == 6
    (root / "b" / "done.json").unlink()                                 # an interrupted shard
    with pytest.raises(TapCacheError, match="shard b.npz is not built yet"):
        TapCache.open(root, spec)


@pytest.mark.parametrize("change, message", [
    (dict(top_k=8), r"field 'top_k' is 4, expected 8"),
    (dict(tap_layers=(0,)), r"field 'tap_layers' is \[1\], expected \[0\]"),
    (dict(target={"model": "other"}), r"field 'target'"),
    (dict(shards=(("a.npz", "0" * 64),)), r"field 'shards': a.npz has sha256"),
    (dict(shards=(("z.npz", "0" * 64),)), r"field 'shards' lacks z.npz"),
])
def test_a_cache_built_for_something_else_is_refused_by_field(target, tmp_path, change, message):
    teacher = teacher_dir(tmp_path, ("a",))
    spec = spec_for(target, teacher, (1,), 4, TARGET_ID)
    root = build(target, teacher, tmp_path / "cache", spec)
    with pytest.raises(TapCacheError, match=message):
        TapCache.open(root, dataclasses.replace(spec, **change))


def test_missing_or_foreign_manifest_is_a_named_error(target, tmp_path):
    teacher = teacher_dir(tmp_path, ("a",))
    spec = spec_for(target, teacher, (1,), 4, TARGET_ID)
    with pytest.raises(TapCacheError, match="no teacher cache here"):
        TapCache.open(tmp_path / "nothing", spec)
    root = build(target, teacher, tmp_path / "cache", spec)
    (root / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(TapCacheError, match="format 'something-else'"):
        TapCache.open(root, spec)


@pytest.mark.parametrize("field, value, message", [
    ("top_k", 0, "CacheSpec.top_k must be in"), ("tap_layers", (), "CacheSpec.tap_layers"),
    ("dtype", "float16", "CacheSpec.dtype must be 'bfloat16'")])
def test_cache_spec_names_bad_fields(target, tmp_path, field, value, message):
    spec = spec_for(target, teacher_dir(tmp_path, ("a",)), (1,), 4, TARGET_ID)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(spec, **{field: value})
