"""Teacher-data shards: round trip, append, and every kind of damage is a named error."""

import json

import pytest

from blockdraft.train.shards import Conversation, DataError, load_conversations, read_manifest, write_shard

TARGET = {"model": "tiny", "dtype": "bfloat16"}
CONVS = [Conversation([1, 2, 3], [4, 5]), Conversation([7], [8, 9, 10, 11]), Conversation([60000, 2], [3])]


def test_round_trip_and_append(tmp_path):
    write_shard(tmp_path, "a", "templated_math", "Apache-2.0", CONVS[:2], TARGET)
    write_shard(tmp_path, "b", "stdlib_code", "PSF-2.0", CONVS[2:], TARGET)
    assert load_conversations(tmp_path) == CONVS
    manifest = read_manifest(tmp_path)
    assert [s["count"] for s in manifest["shards"]] == [2, 1]
    assert manifest["shards"][0]["response_tokens"] == 6 and manifest["shards"][1]["prompt_tokens"] == 2
    with pytest.raises(DataError, match="already in the manifest"):
        write_shard(tmp_path, "a", "templated_math", "Apache-2.0", CONVS[:1], TARGET)
    with pytest.raises(DataError, match="shards were made by"):
        write_shard(tmp_path, "c", "templated_math", "Apache-2.0", CONVS[:1], {"model": "other"})
    with pytest.raises(DataError, match="token id 60000 outside the vocabulary"):
        load_conversations(tmp_path, vocab_size=49152)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "a.npz").write_bytes((d / "a.npz").read_bytes()[:40]), "corrupt or truncated"),
    (lambda d: (d / "a.npz").unlink(), "missing shard"),
    (lambda d: (d / "manifest.json").write_text("{"), "not valid JSON"),
    (lambda d: (d / "manifest.json").write_text(json.dumps({"format": "v0", "shards": []})), "format 'v0'"),
])
def test_damage_is_named(tmp_path, damage, message):
    write_shard(tmp_path, "a", "templated_math", "Apache-2.0", CONVS, TARGET)
    damage(tmp_path)
    with pytest.raises(DataError, match=message):
        load_conversations(tmp_path)


def test_manifest_count_must_match(tmp_path):
    write_shard(tmp_path, "a", "templated_math", "Apache-2.0", CONVS, TARGET)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["shards"][0]["count"] = 5
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="manifest count 5"):
        load_conversations(tmp_path)


def test_committed_teacher_data_loads():
    from pathlib import Path

    root = Path(__file__).parents[2] / "data" / "teacher" / "smollm2"
    convs = load_conversations(root, vocab_size=49152)
    manifest = read_manifest(root)
    assert len(convs) == sum(s["count"] for s in manifest["shards"]) >= 256
    assert all(c.prompt and c.response for c in convs)
