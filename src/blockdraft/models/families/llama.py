"""Llama and Qwen3 (transformers `llama`, `qwen3`): pre-norm attention and SwiGLU layers, GQA, RoPE
scaling, tied or separate LM head. Qwen3 differs only by per-head q/k RMSNorm (`qk_norm`).

The dense family: tensor parallelism, the ONNX export and the fused CPU layer stack take it.
"""

from __future__ import annotations

from ...checkpoints.hf_config import check_silu, decoder_dims, eos_ids
from ...config import TargetConfig
from ..decoder import DecoderLayer
from ..family import Capabilities, Family, GgufSpelling, plain_decoder

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}
MODEL_TYPES = {"llama": "llama", "qwen3": "qwen3"}


def resolve(cfg: dict, architecture: str) -> TargetConfig:
    check_silu(cfg)
    return TargetConfig(
        architecture=architecture, **decoder_dims(cfg, "target"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=architecture == "qwen3",
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids(cfg),
    )


FAMILY = Family(
    name="llama", architectures=ARCHITECTURES, model_types=MODEL_TYPES, resolve=resolve,
    decoder=plain_decoder(DecoderLayer),
    capabilities=Capabilities(tensor_parallel=True, onnx_export=True, fused_layer_stack=True),
    gguf=GgufSpelling(architecture="llama", hf_architecture="LlamaForCausalLM", model_type="llama"),
    drafter_model_type="qwen3",    # the drafter layers (models/drafter.py) are Qwen3 layers: q/k norm
)
