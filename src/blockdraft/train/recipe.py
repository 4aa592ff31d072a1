"""The recipe of the drafters shipped for SmolLM2-135M-Instruct (assets/smollm2/<kind>): their shape, the
bf16 target they learn from, their fresh fp32 training copies, the step schedule, and the held-out
acceptance they are published with. `scripts/train_default_drafters.py` (a teacher-forced target pass
each step) and `scripts/train_cached_drafters.py` (the teacher cache) train them with it;
`scripts/probe_drafter_init.py` probes variants of it.

DSpark prunes its vocabulary to the most frequent response ids (`vocab.py`: a cheap head); DFlash keeps the
target's full vocabulary and LM head (the z-lab layout, no lm_head/d2t stored): llama.cpp's DFlash
converter knows no d2t.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ..default_model import SHIPPED_DRAFTERS
from .trainer import TrainConfig

ASSETS = SHIPPED_DRAFTERS                                # where the drafters are published
TEACHER_DATA = Path("data") / "teacher" / "smollm2"      # the committed teacher shards, under the repository root
TAPS = (1, 8, 15, 22, 29)
LAYERS, BLOCK, MASK_ID, MARKOV_RANK, DRAFT_VOCAB = 2, 8, 16, 64, 12288
KINDS = ("dflash", "dspark")
PRUNED = {"dflash": False, "dspark": True}               # the kinds whose head covers a pruned draft vocabulary
EVAL_SETS, EVAL_PROMPTS, EVAL_TOKENS = ("chat", "humaneval", "math"), 6, 96


def run_config(steps: int, lr: float = 1e-3, first_draw: int = 0, anchors: int = 48,
               gamma: float = TrainConfig.position_gamma) -> TrainConfig:
    """The per-step teacher schedule: 2 sequences x `anchors` anchors a step, checkpoints <= 10 min apart."""
    return TrainConfig(steps=steps, lr=lr, warmup=100, seqs_per_step=2, anchors_per_seq=anchors, seed=0,
                       first_draw=first_draw, save_every=250, save_every_seconds=600, position_gamma=gamma)


def load_llm():
    """The shipped drafters' target: bf16 weights, as their teacher data was made (auto would load int4)."""
    from ..llm import LLM

    return LLM(target="smollm2", drafter="none", dtype="bfloat16", quantization="none", max_batch=1,
               max_model_len=1024)


def teacher_sequences(data: Path):
    """The teacher shards in `data` as `TeacherSeq`s (prompt then response), and what they hold."""
    from .shards import read_manifest, read_shard
    from .trainer import TeacherSeq

    manifest = read_manifest(data)
    seqs = [TeacherSeq(torch.tensor(c.prompt + c.response), None, None, len(c.prompt))
            for info in manifest["shards"] for c in read_shard(data, info)]
    tokens = sum(s["response_tokens"] for s in manifest["shards"])
    return seqs, {"shards": len(manifest["shards"]), "conversations": len(seqs), "response_tokens": tokens}


def new_drafters(llm, seqs, eos_ids, layers: int = LAYERS, kinds: tuple[str, ...] = KINDS,
                 markov_rank: int = MARKOV_RANK, intermediate_size: int | None = None):
    """A new fp32 drafter of each of `kinds`, the pruned ones over the `DRAFT_VOCAB` most frequent response
    ids of `seqs` (+ `eos_ids`), and that vocabulary's summary. `markov_rank` and `intermediate_size` (None:
    the target's) shape every drafter alike."""
    from .vocab import choose_draft_vocab, token_counts

    responses = [s.ids[s.response_start:].tolist() for s in seqs]
    vocab = choose_draft_vocab(token_counts(responses, llm.target.config.vocab_size), DRAFT_VOCAB, always=eos_ids)
    return {kind: new_drafter_from_ids(llm, kind, vocab.ids if PRUNED[kind] else None, layers, markov_rank,
                                       intermediate_size)
            for kind in kinds}, vocab.summary()


def new_drafter_from_ids(llm, kind, ids, layers=LAYERS, markov_rank=MARKOV_RANK, intermediate_size=None):
    """A new fp32 drafter (`ids`: its draft vocabulary; None = the target's). Training reads the target's
    LM head through a frozen fp32 copy: the bf16 one runs multi-row products in row-invariant chunks of
    16, which inference needs and training does not."""
    from ..checkpoints.publish import new_drafter
    from ..models.drafter import SharedWeights

    d = new_drafter(llm.target, kind, layers, BLOCK, TAPS, MASK_ID, markov_rank=markov_rank, draft_vocab=ids,
                    intermediate_size=intermediate_size).float()
    d.shared = SharedWeights(d.shared.embed_tokens, fp32_head(llm.target))
    return d


@functools.lru_cache(maxsize=1)
def fp32_head(target) -> torch.nn.Linear:
    """A frozen fp32 copy of the target's LM head, made once and shared by every drafter and loss."""
    w = target.lm_head.weight.detach().float()
    head = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    head.weight = torch.nn.Parameter(w, requires_grad=False)
    return head


def eval_prompts(llm) -> dict[str, list[list[int]]]:
    """The held-out prompts, `EVAL_PROMPTS` of each of `EVAL_SETS`, chat-templated and encoded."""
    from ..bench.prompt_sets import load_set

    return {name: [llm.encode(p, chat=True) for p in load_set(name, EVAL_PROMPTS)] for name in EVAL_SETS}


def held_out_al(llm, drafter_dir: Path, prompts: dict[str, list[list[int]]]) -> dict:
    """Greedy held-out mean AL per set at the full block, and per-position acceptance."""
    from ..loading import load_drafter
    from .trainer import acceptance_lengths

    drafter = load_drafter(drafter_dir, llm.target)
    out = {}
    n = drafter.config.num_draft_tokens
    for name, ids in prompts.items():
        lengths = [a for per_prompt in acceptance_lengths(llm.target, drafter, ids, EVAL_TOKENS) for a in per_prompt]
        reach = [sum(1 for a in lengths if a > k) / len(lengths) for k in range(1, n + 1)]
        out[name] = {"mean_al": sum(lengths) / len(lengths), "steps": len(lengths), "per_position": reach}
    return out
