"""Build the tiny checkpoints (src/blockdraft/assets/tiny/, bf16 safetensors).

They are the parity tests' and most other tests' fixtures.

The target is a random Qwen3 whose LM head is tied to a random permutation of its
embedding, so its greedy text is partly predictable (a noisy bigram chain). The
drafters (DFlash, DFlash2, DSpark) are then trained (`train.trainer.fit`) on the target's own
greedy continuations for a few hundred steps, so acceptance lengths are > 1 and token /
acceptance comparisons against the references mean something.

Rerunning this script gives weights other than the committed ones, so regenerate the goldens
with them (`scripts/goldens/regen.sh --fixtures` does both).

    python scripts/make_fixtures.py                  # rewrites src/blockdraft/assets/tiny/*
    python scripts/make_fixtures.py --only dspark-last,dflash-last   # just these drafters
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from blockdraft.loading import load_drafter, load_target
from blockdraft.train.trainer import TrainConfig, fit, teacher_data, teacher_responses
from blockdraft.train.vocab import choose_draft_vocab, token_counts

OUT = Path(__file__).resolve().parents[1] / "src" / "blockdraft" / "assets" / "tiny"
VOCAB, HIDDEN, LAYERS = 128, 64, 4
MASK_ID, EOS_ID = 126, 127
DRAFT_VOCAB = 96

COMMON = {"model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 128,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
          "rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
          "max_position_embeddings": 512, "hidden_act": "silu", "attention_bias": False,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}

TARGET = {**COMMON, "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": LAYERS, "eos_token_id": EOS_ID,
          "bos_token_id": None}

DRAFTERS = {
    "dflash": {**COMMON, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 2, "num_target_layers": LAYERS,
               "block_size": 6, "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": [0, 2]}},
    "dflash-sliding": {**COMMON, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 2,
                       "num_target_layers": LAYERS, "block_size": 6, "use_sliding_window": True,
                       "sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"],
                       "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": [1]}},
    "dflash2": {**COMMON, "architectures": ["DFlash2DraftModel"], "num_hidden_layers": 2,
                "num_target_layers": LAYERS, "block_size": 6,
                "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": [0, 2], "conv_kernel_size": 3,
                                  "conv_group_size": 16, "selector_top_k": 4, "selector_rank": 8}},
    "dspark": {**COMMON, "architectures": ["Qwen3DSparkModel"], "num_hidden_layers": 2, "num_target_layers": LAYERS,
               "target_layer_ids": [0, 2], "block_size": 5, "mask_token_id": MASK_ID, "markov_rank": 16,
               "enable_confidence_head": True, "confidence_head_with_markov": True,
               "num_anchors": 512, "loss_decay_gamma": 4.0},  # training-only keys are ignored
    # tapping the target's last layer, where the two tap points differ (docs/design.md §2): DSpark reads
    # it before the final norm (layer_output), DFlash after it (hidden_states)
    "dspark-last": {**COMMON, "architectures": ["Qwen3DSparkModel"], "num_hidden_layers": 2,
                    "num_target_layers": LAYERS, "target_layer_ids": [1, LAYERS - 1], "block_size": 5,
                    "mask_token_id": MASK_ID, "markov_rank": 16, "enable_confidence_head": True,
                    "confidence_head_with_markov": True},
    "dflash-last": {**COMMON, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 2,
                    "num_target_layers": LAYERS, "block_size": 6,
                    "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": [1, LAYERS - 1]}},
    # a pruned draft vocabulary (d2t/t2d): vLLM speculators' DFlash layout, and our DSpark layout
    "dflash-speculators": {"speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"],
                           "transformer_layer_config": {**COMMON, "num_hidden_layers": 2},
                           "draft_vocab_size": DRAFT_VOCAB, "block_size": 6, "aux_hidden_state_layer_ids": [0, 2],
                           "mask_token_id": MASK_ID, "target_hidden_size": HIDDEN,
                           "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy",
                                                  "proposal_methods": [{"proposal_type": "greedy",
                                                                        "speculative_tokens": 5}],
                                                  "verifier": {"name_or_path": "../target-qwen3",
                                                               "architectures": ["Qwen3ForCausalLM"]}}},
    "dspark-pruned": {**COMMON, "architectures": ["Qwen3DSparkModel"], "num_hidden_layers": 2,
                      "num_target_layers": LAYERS, "target_layer_ids": [0, 2], "block_size": 5,
                      "mask_token_id": MASK_ID, "markov_rank": 16, "enable_confidence_head": True,
                      "confidence_head_with_markov": True, "draft_vocab_size": DRAFT_VOCAB},
}


def write(dir_: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    shutil.rmtree(dir_, ignore_errors=True)
    dir_.mkdir(parents=True)
    (dir_ / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()).contiguous()
               for k, v in tensors.items()},
              str(dir_ / "model.safetensors"))


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tokenizer(dir_: Path) -> None:
    """A real tokenizer.json: one token per ASCII character (ids 0..123), ChatML markers, mask, EOS."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {chr(i): i for i in range(124)}
    specials = {"<|im_start|>": 124, "<|im_end|>": 125, "<|mask|>": MASK_ID, "<|endoftext|>": EOS_ID}
    tok = Tokenizer(models.BPE(vocab={**vocab, **specials}, merges=[], unk_token=None))
    tok.add_special_tokens(list(specials))
    tok.decoder = decoders.Fuse()
    tok.save(str(dir_ / "tokenizer.json"))
    (dir_ / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHAT_TEMPLATE,
         "model_max_length": 512}, indent=2) + "\n")


def target_tensors(gen: torch.Generator) -> dict[str, torch.Tensor]:
    def rnd(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    embed = rnd(VOCAB, HIDDEN, std=1.0)
    perm = torch.randperm(VOCAB, generator=gen)               # bigram: token t -> perm[t]
    lm_head = torch.empty_like(embed)
    lm_head[perm] = embed * 0.5
    t = {"model.embed_tokens.weight": embed, "lm_head.weight": lm_head, "model.norm.weight": torch.ones(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name, shape in [("self_attn.q_proj", (64, HIDDEN)), ("self_attn.k_proj", (32, HIDDEN)),
                            ("self_attn.v_proj", (32, HIDDEN)), ("self_attn.o_proj", (HIDDEN, 64)),
                            ("mlp.gate_proj", (128, HIDDEN)), ("mlp.up_proj", (128, HIDDEN)),
                            ("mlp.down_proj", (HIDDEN, 128))]:
            t[p + name + ".weight"] = rnd(*shape, std=0.13)
        for name, dim in [("input_layernorm", HIDDEN), ("post_attention_layernorm", HIDDEN),
                          ("self_attn.q_norm", 16), ("self_attn.k_norm", 16)]:
            t[p + name + ".weight"] = 1.0 + rnd(dim, std=0.1)
    return t


def drafter_tensors(name: str, cfg: dict, target, gen: torch.Generator,
                    draft_vocab: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Random init in the published names; DSpark ships its own embed/lm_head copies (DeepSeek layout).
    `draft_vocab` (sorted target ids): a pruned head of those rows, with the d2t/t2d maps."""
    from blockdraft.checkpoints.resolve import resolve_drafter
    from blockdraft.models.drafter import BlockDrafter

    out_vocab = VOCAB if draft_vocab is None else len(draft_vocab)
    shapes = {}
    if name.startswith("dspark"):
        shapes = {"markov_head.markov_w1.weight": (VOCAB, 16), "markov_head.markov_w2.weight": (out_vocab, 16),
                  "confidence_head.proj.weight": (1, HIDDEN + 16), "confidence_head.proj.bias": (1,),
                  "embed_tokens.weight": (VOCAB, HIDDEN), "lm_head.weight": (out_vocab, HIDDEN)}
    if draft_vocab is not None:
        shapes.update({"lm_head.weight": (out_vocab, HIDDEN), "d2t": (out_vocab,), "t2d": (VOCAB,)})
    dcfg = resolve_drafter(cfg, shapes)
    model = BlockDrafter(dcfg, target)
    out = {}
    for key, p in model.state_dict().items():
        if key.endswith("norm.weight"):
            out[key] = torch.ones_like(p)
        elif key == "embed_tokens.weight":
            out[key] = target.embed_tokens.weight.clone()
        elif key == "lm_head.weight":
            out[key] = target.lm_head.weight[draft_vocab if draft_vocab is not None else slice(None)].clone()
        elif key == "d2t":
            out[key] = draft_vocab - torch.arange(len(draft_vocab))
        elif key == "t2d":
            out[key] = torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, draft_vocab, True)
        else:
            out[key] = torch.randn(p.shape, generator=gen) * (0.02 if "codebook" in key else 0.15)
    if name == "dflash2":  # published DFlash2 checkpoints store codebooks without `.weight`
        for cb in ("predecessor_codebook", "successor_codebook"):
            out[f"candidate_selector.{cb}"] = out.pop(f"candidate_selector.{cb}.weight")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="rebuild the tiny fixtures")
    ap.add_argument("--only", default="", help="comma-separated drafter names: rebuild just these "
                    "(the target and the other drafters stay as committed)")
    only = [n for n in ap.parse_args(argv).only.split(",") if n]
    unknown = sorted(set(only) - set(DRAFTERS))
    if unknown:
        raise SystemExit(f"--only: unknown fixtures {unknown}; choose from {sorted(DRAFTERS)}")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    if not only:
        write(OUT / "target-qwen3", TARGET, target_tensors(gen))
        write_tokenizer(OUT / "target-qwen3")
    else:
        target_tensors(gen)                     # same generator state as a full rebuild
    target = load_target(OUT / "target-qwen3")
    prompts = [torch.randint(0, MASK_ID, (int(n),), generator=gen).tolist()
               for n in torch.randint(4, 16, (48,), generator=gen)]
    for name, cfg in DRAFTERS.items():
        if only and name not in only:
            continue
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))   # each fixture its own stream
        t0 = time.time()
        vocab = None
        if "draft_vocab_size" in cfg:   # the most frequent ids of the target's greedy responses
            counts = token_counts(teacher_responses(target, prompts, 48), VOCAB)
            vocab = choose_draft_vocab(counts, cfg["draft_vocab_size"], always=[EOS_ID]).ids
        write(OUT / name, cfg, drafter_tensors(name, cfg, target, gen, vocab))
        drafter = load_drafter(OUT / name, target)
        data = teacher_data(target, prompts, 48, drafter.config.taps)
        history = fit(drafter, data, TrainConfig(steps=500, lr=1e-2, seqs_per_step=1, anchors_per_seq=8, seed=7),
                      progress=False)
        losses = [h["loss"] for h in history]
        tensors = {k: v for k, v in drafter.state_dict().items()}
        if name == "dflash2":
            for cb in ("predecessor_codebook", "successor_codebook"):
                tensors[f"candidate_selector.{cb}"] = tensors.pop(f"candidate_selector.{cb}.weight")
        write(OUT / name, cfg, tensors)
        print(f"{name}: loss {losses[0]:.3f} -> {sum(losses[-20:]) / 20:.3f} in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
