"""Tiny random targets with per-sequence state — Qwen3.5 (dense and MoE, text-only and multimodal layouts)
LFM2 (dense and MoE), gpt-oss (sliding-window layers, sinks, MoE) and Gemma 4 (dense and MoE, text-only
and multimodal layouts) — built with transformers 5.15 and saved with `save_pretrained`, as a user's checkpoint would be;
and drafters for them."""

from __future__ import annotations

import json
import shutil
from functools import lru_cache
from pathlib import Path

import torch

from blockdraft.llm import TINY_ASSETS
from blockdraft.loading import load_drafter, load_target

TOKENIZER = TINY_ASSETS / "target-qwen3"

VOCAB = 128                 # the tiny fixtures' tokenizer (copied beside the checkpoint)
LAYERS = 4                  # layer_types: linear, linear, linear, full (full_attention_interval 4)


def _text_config(moe: bool) -> dict:
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=LAYERS,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
               linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
               linear_num_key_heads=2, linear_num_value_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=False,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
               eos_token_id=VOCAB - 2, bos_token_id=1)
    if moe:
        cfg.update(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
    return cfg


def hf_model(moe: bool = False, multimodal: bool = False, seed: int = 0):
    """A random transformers Qwen3.5 model whose parameters all have visible magnitude (the (1 + w) norms
    and the DeltaNet's A_log / dt_bias get random values too)."""
    import transformers as tf
    torch.manual_seed(seed)
    text = _text_config(moe)
    if multimodal:
        cls, cfg_cls = ((tf.Qwen3_5MoeForConditionalGeneration, tf.Qwen3_5MoeConfig) if moe
                        else (tf.Qwen3_5ForConditionalGeneration, tf.Qwen3_5Config))
        vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=4,
                      num_position_embeddings=16)
        config = cfg_cls(text_config=text, vision_config=vision, tie_word_embeddings=False)
    else:
        cls, cfg_cls = ((tf.Qwen3_5MoeForCausalLM, tf.Qwen3_5MoeTextConfig) if moe
                        else (tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig))
        config = cfg_cls(**text)
    config._attn_implementation = "eager"
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.2)                       # (1 + w) and gated-norm gains off their init
            elif name.endswith("A_log"):
                p.uniform_(-1.0, 1.0)
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 0.5)
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
            elif name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 1.0)
            elif name.endswith(("o_proj.weight", "out_proj.weight", "down_proj")) or name.endswith("down_proj.weight"):
                p.normal_(0.0, 0.06)                      # mixers and MLPs nudge the residual stream
            else:
                p.normal_(0.0, 0.15)
        bigram_head(model, seed)
    return model


def bigram_head(model, seed: int) -> None:
    """The LM head becomes a permutation of the embedding: greedy text is a noisy bigram chain, which a
    drafter can partly learn (acceptance lengths > 1 mean something)."""
    embed = model.get_input_embeddings().weight
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed + 7))
    model.lm_head.weight.copy_(embed[perm] * 2.0)


@torch.inference_mode()
def greedy_with_cache(model, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """Greedy decoding through blockdraft's contiguous cache: the prompt in one pass, then one row a step."""
    cache = model.new_cache(1, prompt.shape[1] + new_tokens + 1)
    tokens = prompt[0].tolist()
    out = model(prompt, cache)
    cache.truncate(prompt.shape[1])
    for _ in range(new_tokens):
        tokens.append(int(out.logits[0, -1].argmax()))
        out = model(torch.tensor([[tokens[-1]]]), cache)
        cache.truncate(len(tokens))
    return tokens


@torch.inference_mode()
def check_rollback(target, prompt: torch.Tensor, block: torch.Tensor) -> None:
    """Verify `block` after `prompt` and keep 0..all of its rows: every per-sequence state (windows
    included, rows from before the step too) is bitwise that of a run that saw only the kept rows, and
    the next step's logits agree bitwise."""
    for keep in range(block.shape[1] + 1):
        spec = target.new_cache(1, 64)
        target(prompt, spec)
        spec.truncate(prompt.shape[1])
        target(block, spec)
        spec.truncate(prompt.shape[1] + keep)
        fresh = target.new_cache(1, 64)
        target(torch.cat([prompt, block[:, :keep]], dim=1), fresh)
        fresh.truncate(prompt.shape[1] + keep)
        for i in spec.states.layers:
            assert torch.equal(spec.states.windows[i], fresh.states.windows[i]), f"layer {i}, keep={keep}"
        nxt = torch.tensor([[50]])
        assert torch.equal(target(nxt, spec).logits, target(nxt, fresh).logits), f"keep={keep}"


def check_speculative_equals_plain(target, drafter) -> None:
    """Speculative greedy output equals plain greedy output at batch 8 (mixed prompt lengths, up to 40:
    past the tiny sliding windows) and at batch 1, drafts are partly accepted, and two sequences' tokens
    and per-step acceptance lengths equal the cache-free loop's."""
    from blockdraft.engine.engine import EngineConfig, LLMEngine
    from blockdraft.sampling.params import SamplingParams
    from decode_oracle import generate_cache_free
    batch = prompts(8, seed=21, low=3, high=40)
    params = SamplingParams(max_tokens=16, ignore_eos=True)

    def engine(d, rows):
        return LLMEngine(target, d, EngineConfig(max_batch=rows, cache_budget_bytes=4 << 20, max_model_len=128,
                                                  adaptive_speculation=False))
    plain = engine(None, 8).generate(batch, params)
    spec = engine(drafter, 8).generate(batch, params)
    als = [a for o in spec for a in o.acceptance_lengths]
    assert 1 < sum(als) / len(als) < drafter.config.num_draft_tokens + 1, "drafts must be partly accepted"
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert [o.token_ids for o in engine(drafter, 1).generate(batch[:2], params)] == [o.token_ids for o in plain[:2]]
    for p, o in list(zip(batch, spec))[:2]:
        oracle = generate_cache_free(target, p, params.max_tokens, drafter)
        assert (o.token_ids, o.acceptance_lengths) == (oracle.token_ids, oracle.acceptance_lengths)


def edited_checkpoint(src: Path, dst: Path, edit) -> Path:
    """A copy of the checkpoint at `src` whose config.json (and files) `edit(cfg, dst)` changes."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg, dst)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def without_tensor(name: str):
    """An `edited_checkpoint` edit that deletes the tensor `name` from model.safetensors."""
    def edit(cfg: dict, dst: Path) -> None:
        from safetensors.torch import load_file, save_file
        tensors = load_file(str(dst / "model.safetensors"))
        del tensors[name]
        save_file(tensors, str(dst / "model.safetensors"))
    return edit


def lfm2_model(seed: int = 0, moe: bool = False):
    """A random transformers LFM2 (short conv, attention, conv, attention), scaled as `hf_model`; with
    `moe`, LFM2-MoE: the first layer dense, the others sigmoid-routed experts with a random expert bias
    and a routed scaling factor."""
    import transformers as tf
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, conv_L_cache=3, tie_word_embeddings=False,
                  eos_token_id=VOCAB - 2, bos_token_id=1, pad_token_id=0)
    if moe:
        config = tf.Lfm2MoeConfig(**common, intermediate_size=96, moe_intermediate_size=32, num_dense_layers=1,
                                  num_experts=6, num_experts_per_tok=2, routed_scaling_factor=1.5,
                                  layer_types=["conv", "full_attention", "conv", "full_attention"])
    else:
        config = tf.Lfm2Config(**common, intermediate_size=192, full_attn_idxs=[1, 3], block_multiple_of=32)
    config._attn_implementation = "eager"
    model = (tf.Lfm2MoeForCausalLM if moe else tf.Lfm2ForCausalLM)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
            elif name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 1.0)
            elif name.endswith("feed_forward.gate.weight"):
                p.normal_(0.0, 0.5)
            elif name.endswith(("out_proj.weight", "w2.weight", "down_proj")):
                p.normal_(0.0, 0.06)
            else:
                p.normal_(0.0, 0.15)
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.normal_(0.0, 0.3)
        bigram_head(model, seed)
    return model


WINDOW = 8                  # the tiny gpt-oss's sliding window: prompts and outputs run past it


def gpt_oss_model(seed: int = 0):
    """A random transformers gpt-oss: sliding (window 8) and full layers alternating, sinks, 4 experts of
    which 2 per token, scaled as `hf_model`."""
    import transformers as tf
    torch.manual_seed(seed)
    config = tf.GptOssConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, head_dim=16,
                             num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=LAYERS,
                             num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                             max_position_embeddings=512, eos_token_id=VOCAB - 2, bos_token_id=1, pad_token_id=0)
    config._attn_implementation = "eager"
    model = tf.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
            elif name.endswith(("embed_tokens.weight", "sinks")):
                p.normal_(0.0, 1.0)
            elif "router" in name:
                p.normal_(0.0, 0.5)
            elif name.endswith(("o_proj.weight", "down_proj")):
                p.normal_(0.0, 0.06)
            else:
                p.normal_(0.0, 0.15)
        bigram_head(model, seed)
    return model


GEMMA4_TYPES = ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention",
                                                                                           "sliding_attention",
                                                                                           "full_attention"]


def gemma4_text_config(moe: bool, **overrides) -> dict:
    """A tiny Gemma 4 exercising every feature: 8 layers (sliding window 4, full layers with their own head
    size and, on `moe`, one K/V head with V = K), the last 3 layers sharing K/V (double-wide MLPs),
    per-layer embeddings, final-logit softcapping; `moe`: routed experts beside every MLP."""
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=8, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
               attention_k_eq_v=moe, layer_types=GEMMA4_TYPES, sliding_window=4, num_kv_shared_layers=3,
               use_double_wide_mlp=True, hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB,
               final_logit_softcapping=30.0, max_position_embeddings=512, enable_moe_block=moe,
               rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1e6}},
               pad_token_id=0, bos_token_id=1, eos_token_id=VOCAB - 2, tie_word_embeddings=False)
    if moe:
        cfg.update(num_experts=4, top_k_experts=2, moe_intermediate_size=24)
    cfg.update(overrides)
    return cfg


def gemma4_model(moe: bool = False, multimodal: bool = False, seed: int = 0):
    """A random transformers Gemma 4 (`gemma4_text_config`); `multimodal`: inside the published
    `Gemma4ForConditionalGeneration` layout, with tiny vision and audio towers."""
    import transformers as tf
    torch.manual_seed(seed)
    text = tf.Gemma4TextConfig(**gemma4_text_config(moe))
    if multimodal:
        vision = tf.Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=2, head_dim=16, position_embedding_size=64)
        audio = tf.Gemma4AudioConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, output_proj_dims=48,
                                     subsampling_conv_channels=[8, 4])
        config = tf.Gemma4Config(text_config=text.to_dict(), vision_config=vision, audio_config=audio,
                                 tie_word_embeddings=False)
        model_cls = tf.Gemma4ForConditionalGeneration
    else:
        config, model_cls = text, tf.Gemma4ForCausalLM
    config._attn_implementation = "eager"
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("router.scale", "per_expert_scale")):
                p.normal_(1.0, 0.3)
            elif "embed" in name:
                p.normal_(0.0, 1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight", "down_proj", "per_layer_projection.weight")):
                p.normal_(0.0, 0.06)
            else:
                p.normal_(0.0, 0.15)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)
        bigram_head(model, seed)
    return model


@lru_cache(maxsize=None)
def checkpoint(root: str, moe: bool = False, multimodal: bool = False, arch: str = "qwen3_5") -> Path:
    """Saved once per test session under `root`."""
    path = Path(root) / f"{arch}{'_moe' if moe else ''}{'_mm' if multimodal else ''}"
    if not (path / "config.json").is_file():
        model = (hf_model(moe, multimodal) if arch == "qwen3_5" else gpt_oss_model() if arch == "gpt_oss"
                 else gemma4_model(moe, multimodal) if arch == "gemma4" else lfm2_model(moe=moe))
        model.save_pretrained(path)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(TOKENIZER / name, path / name)
    return path


def drafter_dir(root: Path, kind: str, taps: tuple[int, ...] = (0, 3), seed: int = 1,
                layout: str = "zlab") -> Path:
    """A random DFlash / DSpark drafter for the tiny Qwen3.5 target (hidden 64), in the z-lab layout
    (DFlash) or DeepSpec's (DSpark), or speculators' (`layout="speculators"`)."""
    from safetensors.torch import save_file
    torch.manual_seed(seed)
    path = Path(root) / f"{kind}-{layout}-{'-'.join(map(str, taps))}-{seed}"
    if (path / "config.json").is_file():
        return path
    path.mkdir(parents=True)
    hidden, inter, layers, heads, kv, hd = 64, 96, 1, 4, 2, 16
    block = 4
    cfg = {"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "vocab_size": VOCAB,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
           "layer_types": ["full_attention"] * layers, "block_size": block}
    tensors = {"fc.weight": torch.randn(hidden, len(taps) * hidden) * 0.1,
               "hidden_norm.weight": torch.ones(hidden), "norm.weight": torch.ones(hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        tensors.update({p + "self_attn.q_proj.weight": torch.randn(heads * hd, hidden) * 0.1,
                        p + "self_attn.k_proj.weight": torch.randn(kv * hd, hidden) * 0.1,
                        p + "self_attn.v_proj.weight": torch.randn(kv * hd, hidden) * 0.1,
                        p + "self_attn.o_proj.weight": torch.randn(hidden, heads * hd) * 0.1,
                        p + "self_attn.q_norm.weight": torch.ones(hd), p + "self_attn.k_norm.weight": torch.ones(hd),
                        p + "mlp.gate_proj.weight": torch.randn(inter, hidden) * 0.1,
                        p + "mlp.up_proj.weight": torch.randn(inter, hidden) * 0.1,
                        p + "mlp.down_proj.weight": torch.randn(hidden, inter) * 0.1,
                        p + "input_layernorm.weight": torch.ones(hidden),
                        p + "post_attention_layernorm.weight": torch.ones(hidden)})
    if kind == "dspark":
        rank = 8
        cfg.update(architectures=["Qwen3DSparkModel"], markov_rank=rank, enable_confidence_head=True,
                   dspark_config={"target_layer_ids": list(taps), "mask_token_id": VOCAB - 1, "block_size": block})
        tensors.update({"markov_head.markov_w1.weight": torch.randn(VOCAB, rank) * 0.3,
                        "markov_head.markov_w2.weight": torch.randn(VOCAB, rank) * 0.3,
                        "confidence_head.proj.weight": torch.randn(1, hidden + rank) * 0.1,
                        "confidence_head.proj.bias": torch.zeros(1)})
    else:
        cfg.update(architectures=["DFlashDraftModel"],
                   dflash_config={"target_layer_ids": list(taps), "mask_token_id": VOCAB - 1})
    if layout == "speculators":
        inner = {k: cfg.pop(k) for k in list(cfg) if k not in ("architectures",)}
        nested = inner.pop("dspark_config", None) or inner.pop("dflash_config")
        cfg = {"speculators_model_type": kind, "architectures": ["DSparkSpeculator" if kind == "dspark"
                                                                  else "DFlashSpeculator"],
               "transformer_layer_config": inner, **{k: v for k, v in nested.items()},
               "aux_hidden_state_layer_ids": list(nested["target_layer_ids"])}
        cfg.pop("target_layer_ids")
        for k in ("markov_rank", "enable_confidence_head"):
            if k in inner:
                cfg[k] = inner.pop(k)
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def prompts(n: int, seed: int, low: int = 4, high: int = 16) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB - 2, (int(k),), generator=g).tolist() for k in torch.randint(low, high, (n,), generator=g)]


@lru_cache(maxsize=None)
def trained_drafter_dir(root: str, kind: str, moe: bool = False, arch: str = "qwen3_5") -> Path:
    """A drafter distilled for a few hundred steps on the tiny target's own greedy text (fp32), saved
    in the published layout (bf16): it partly agrees with the target (acceptance lengths ~2-4 of 5)."""
    from blockdraft.checkpoints.publish import save_drafter
    from blockdraft.train.trainer import TrainConfig, fit, teacher_data
    out = Path(root) / f"trained-{kind}{'-moe' if moe else ''}-{arch}"
    if (out / "config.json").is_file():
        return out
    target = load_target(checkpoint(root, moe, arch=arch), dtype="float32")
    drafter = load_drafter(drafter_dir(Path(root), kind), target)
    data = teacher_data(target, prompts(16, 3), 24, drafter.config.taps)
    fit(drafter, data, TrainConfig(steps=200, lr=1e-2, seqs_per_step=1, anchors_per_seq=8, seed=7), progress=False)
    return save_drafter(drafter, target, out)


def load_pair(root: Path, kind: str | None, moe: bool = False, dtype: str = "bfloat16", arch: str = "qwen3_5"):
    """A tiny target (Qwen3.5 dense or MoE, or LFM2) and a trained drafter of `kind` (None: no drafter)."""
    target = load_target(checkpoint(str(root), moe, arch=arch), dtype=dtype)
    drafter = None if kind is None else load_drafter(trained_drafter_dir(str(root), kind, moe, arch), target)
    return target, drafter
