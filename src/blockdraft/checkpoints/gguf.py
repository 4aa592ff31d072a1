"""GGUF (llama.cpp) → Hugging Face directory: dequantized safetensors, config.json, tokenizer.json.

Uses the `gguf` package (a convert-time extra) to read and dequantize tensors. llama.cpp
stores q/k projections with their rotary halves interleaved per head; we undo that
permutation so the NeoX-layout RoPE of `layers/rope.py` applies. The tokenizer is
rebuilt from the GGUF vocabulary and merges as a byte-level BPE; SmolLM's `smollm`
pre-tokenizer splits digits individually, which is kept.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from ..errors import CheckpointError, ConfigError
from ..models.registry import gguf_spelling

log = logging.getLogger(__name__)

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
PRE_TOKENIZERS_WITH_DIGITS = ("smollm", "llama-bpe", "llama3")
TOKEN_TYPE_CONTROL = 3


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k permute: rows (head, half, pair) -> (head, pair-half, ...)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_config(reader) -> dict:
    spelling = gguf_spelling(_field(reader, "general.architecture"))
    p = spelling.architecture + "."
    tokens = _field(reader, "tokenizer.ggml.tokens")
    hidden, heads = int(_field(reader, p + "embedding_length")), int(_field(reader, p + "attention.head_count"))
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    return {
        "architectures": [spelling.hf_architecture], "model_type": spelling.model_type,
        "vocab_size": int(_field(reader, p + "vocab_size", len(tokens))),
        "hidden_size": hidden, "intermediate_size": int(_field(reader, p + "feed_forward_length")),
        "num_hidden_layers": int(_field(reader, p + "block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, p + "attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, p + "rope.dimension_count", hidden // heads)),
        "rms_norm_eps": float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(reader, p + "rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, p + "context_length", 2048)),
        "tie_word_embeddings": not has_output, "hidden_act": "silu", "attention_bias": False,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }


def gguf_tensors(reader, config: dict, dtype: torch.dtype, progress) -> dict[str, torch.Tensor]:
    from gguf import dequantize

    out = {}
    for t in reader.tensors:
        name = GLOBAL_NAMES.get(t.name)
        if name is None:
            parts = t.name.split(".")           # blk.N.attn_q.weight
            if parts[0] != "blk" or parts[2] not in LAYER_NAMES:
                raise CheckpointError(f"unknown GGUF tensor {t.name!r}")
            name = f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape(tuple(int(d) for d in reversed(t.shape)))   # GGML dims are innermost-first
        if name.endswith("q_proj.weight"):
            w = unpermute(w, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, config["num_key_value_heads"])
        out[name] = torch.from_numpy(np.ascontiguousarray(w)).to(dtype)
        progress(1)
    return out


def gguf_tokenizer(reader, context_length: int):
    """Byte-level BPE from the GGUF vocabulary, merges and control tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ConfigError(f"GGUF tokenizer model {_field(reader, 'tokenizer.ggml.model')!r} is not supported "
                          "(supported: gpt2 byte-level BPE)")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    types = list(_field(reader, "tokenizer.ggml.token_type"))
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if _field(reader, "tokenizer.ggml.pre") in PRE_TOKENIZERS_WITH_DIGITS:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, kind in zip(tokens, types) if kind == TOKEN_TYPE_CONTROL])
    ids = {name: _field(reader, f"tokenizer.ggml.{name}_token_id") for name in ("bos", "eos", "unknown", "padding")}
    name_of = (lambda i: tokens[i] if i is not None else None)
    # tokenizer_class: a generic fast tokenizer over tokenizer.json. Without it transformers picks
    # the model_type's own tokenizer class (LlamaTokenizerFast for Llama), which adds an `<unk>` token the model does not have
    # (49,153 ids for a 49,152-row embedding) when no unk_token is named.
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast",
                  "bos_token": name_of(ids["bos"]), "eos_token": name_of(ids["eos"]),
                  "unk_token": name_of(ids["unknown"]), "pad_token": name_of(ids["padding"]),
                  "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
                  "chat_template": _field(reader, "tokenizer.chat_template"),
                  "model_max_length": context_length}
    return tok, tok_config


CONVERT_VERSION = 2    # bump when the written directory changes; cached conversions older than this are redone


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "bfloat16",
                 show_progress: bool = True) -> Path:
    """Write a HF directory for `gguf_path` into `out_dir`; returns `out_dir`."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ConfigError("convert needs the `gguf` package: pip install 'blockdraft[convert]'") from None
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise CheckpointError(f"missing file: {gguf_path}")
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(dtype)
    if torch_dtype is None:
        raise ConfigError(f"dtype {dtype!r} is not supported for convert (choose bfloat16 or float32)")
    reader = GGUFReader(str(gguf_path))
    config = gguf_config(reader)
    config["torch_dtype"] = dtype
    from tqdm import tqdm

    bar = tqdm(total=len(reader.tensors), desc=f"converting {gguf_path.name}", unit="tensor",
               disable=not show_progress)
    tensors = gguf_tensors(reader, config, torch_dtype, bar.update)
    bar.close()
    tokenizer, tok_config = gguf_tokenizer(reader, config["max_position_embeddings"])
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config["blockdraft_convert_version"] = CONVERT_VERSION
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    return out_dir
