"""DSpark (DeepSeek DeepSpec): a DFlash backbone with a low-rank Markov head chaining the slots and a
confidence head.

Every slot of the block predicts (`shift_label`: slot i predicts position start+i+1); draft i is the
argmax (or a draw) over the full (draft) vocabulary of `logits_i + W2(W1[prev_i])`, prev_0 = the anchor,
prev_i = draft i. The confidence head estimates P(slot accepted) from [hidden ‖ W1[prev]] and may cut
the block (it never changes the output). Taps are each layer's raw output.

Published as DeepSpec's `Qwen3DSparkModel` with top-level keys (LiquidAI: `Lfm2DSparkDraftModel`;
vLLM speculators: `DSparkSpeculator`; SpecForge: `DFlashDraftModel` with `projector_type: dspark`);
ONNX Runtime GenAI's `model.dspark`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import ConfigError
from ..layers import cpu_kernels as kernels
from ..layers.linear import StableLinear, fp32_weight
from ..layers.vocab import FULL
from ..parallel.layers import ShardedVocab, TPGroup
from ..sampling.params import SamplingParams
from ..sampling.probs import sample_from, sampling_probs
from ..spec_decode.lattice import Lattice, predecessors
from ..spec_decode.proposal import Proposal
from .kind import DrafterKind, OnnxExport, Training

NAME = "dspark"


@dataclass(frozen=True)
class DSparkHeads:
    """DSpark's head settings, named as DeepSpec's config spells them."""

    markov_rank: int                          # W1 [V, r], W2 [r -> Vd]
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = True  # the confidence head also reads W1[prev]
    confidence_bias: bool = True

    def set_fields(self) -> list[str]:
        """`field=value` for each switch that gives a drafter DSpark heads (rank > 0, confidence head on)."""
        return _heads_switched_on(lambda name: getattr(self, name))


HEAD_FIELDS = ("markov_rank", "enable_confidence_head")     # set (nonzero / true): the drafter has DSpark heads

# where published configs spell each head field (`registry.spellings` adds the ONNX runtime section)
SPELLINGS = {
    "markov_rank": ("markov_rank", "dflash_config.markov_rank", "dspark_config.markov_rank", "dspark_markov_rank"),
    "markov_head_type": ("markov_head_type", "dflash_config.markov_head_type", "dspark_config.markov_head_type",
                         "dspark_markov_head_type"),
    "enable_confidence_head": ("enable_confidence_head", "dflash_config.enable_confidence_head",
                               "dspark_config.enable_confidence_head", "dspark_enable_confidence_head"),
    "confidence_head_with_markov": ("confidence_head_with_markov", "dflash_config.confidence_head_with_markov",
                                    "dspark_config.confidence_head_with_markov",
                                    "dspark_confidence_head_with_markov"),
}


class MarkovHead(nn.Module):
    """DSpark low-rank transition bias: bias(prev) = W2(W1[prev]) in fp32, [.., out_vocab].

    W1 is read at the previous token's target id; W2 scores the draft vocabulary (the whole
    vocabulary unless the drafter prunes it). A bf16 drafter on the CPU computes it with
    `cpu_kernels.markov_bias` (W2 read as bf16, each output's rank terms fused-multiply-added in
    order: the same bits at any batch; a greedy chain reads W2 once per slot over the whole
    vocabulary, `pick` taking the bias, the sum and the argmax in that one pass, so W2's bytes are
    most of a drafting step's Markov cost); elsewhere, and while training, PyTorch's fp32 matmul
    (the two agree to fp32 rounding)."""

    def __init__(self, vocab: int, rank: int, out_vocab: int | None = None):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = StableLinear(rank, out_vocab or vocab, bias=False)
        self.vocab = FULL          # output-id layout (tensor parallelism swaps in its shard ops)

    def forward(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embed = self.markov_w1(prev)
        return self._bias(embed.float()), embed

    def _bias(self, e: torch.Tensor) -> torch.Tensor:
        """W2 e: [.., r] fp32 -> [.., out_vocab] fp32"""
        bias = kernels.markov_bias(e, self.markov_w2.weight)     # bf16 inference on the CPU: W2 read as bf16
        return F.linear(e, fp32_weight(self.markov_w2.weight)) if bias is None else bias

    def pick(self, prev: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A greedy chain's step: prev [b] -> argmax(logits + bias(prev)) [b] (output-layout ids; ties -> lowest)
        and W1[prev] [b, r]. Over the whole vocabulary in one process, bf16 inference on the CPU takes the
        bias, the sum and the argmax in one pass (`cpu_kernels.markov_argmax`: the same index)."""
        embed = self.markov_w1(prev)
        e = embed.float()
        if not self.vocab.sharded and (picked := kernels.markov_argmax(e, self.markov_w2.weight, logits)) is not None:
            return picked, embed
        return self.vocab.argmax(logits.float() + self._bias(e)), embed


class ConfidenceHead(nn.Module):
    """sigmoid(proj([hidden ‖ W1[prev]])) estimates P(slot accepted)."""

    def __init__(self, in_features: int, bias: bool):
        super().__init__()
        self.proj = StableLinear(in_features, 1, bias=bias)

    def forward(self, hidden: torch.Tensor, markov_embed: torch.Tensor | None) -> torch.Tensor:
        x = hidden if markov_embed is None else torch.cat([hidden, markov_embed.to(hidden.dtype)], dim=-1)
        return F.linear(x.float(), fp32_weight(self.proj.weight),
                        None if self.proj.bias is None else self.proj.bias.float())[..., 0]


def markov_chain(logits: torch.Tensor, anchor: torch.Tensor, head: MarkovHead, params: SamplingParams,
                 generator: torch.Generator | None, to_target=None):
    """Chained DSpark proposal over the full (draft) vocabulary. Returns target-id tokens [b, n],
    probs over the draft vocabulary, W1 embeds [b, n, r]. `to_target` maps draft ids to target ids
    (a pruned vocabulary); each slot's W1 is read at the previous token's target id.

    `head.vocab` says how `logits` and the bias are laid out: under tensor parallelism they are
    this rank's vocabulary shard, the argmax is global (ties → lowest id) and sampling draws from
    the gathered distribution, so every rank picks what a single process would.
    """
    ops = head.vocab
    prev, tokens, probs, embeds = anchor, [], [], []
    for i in range(logits.shape[1]):
        if params.greedy:
            prev, embed = head.pick(prev, logits[:, i])
        else:
            bias, embed = head(prev)
            slot_logits = logits[:, i].float() + bias                # [b, vocab] (or [b, vocab / tp])
            probs.append(sampling_probs(ops.gather(slot_logits), params))
            prev = sample_from(probs[-1], generator)
        if to_target is not None:
            prev = to_target(prev)
        tokens.append(prev)
        embeds.append(embed)
    return torch.stack(tokens, 1), (torch.stack(probs, 1) if probs else None), torch.stack(embeds, 1)


def greedy_chain(logits: torch.Tensor, anchor: torch.Tensor, head: MarkovHead, to_target=None) -> torch.Tensor:
    """The greedy DSpark chain over the full (draft) vocabulary: [b, n] draft ids,
    d_i = argmax(logits_i + W2(W1[d_{i-1}])), d_0's predecessor the anchor."""
    prev, out = anchor, []
    for i in range(logits.shape[1]):
        pick, _ = head.pick(prev, logits[:, i])     # vocab shards: a global argmax (ties -> lowest id)
        out.append(pick)
        prev = pick if to_target is None else to_target(pick)
    return torch.stack(out, dim=1)


def dspark_lattice(logits: torch.Tensor, anchor: torch.Tensor, head: MarkovHead, k: int,
                   to_target=None) -> Lattice:
    """logits [b, n, V] (before the Markov bias) -> lattice with edges W1[pred] · W2[cand].

    The K candidates of a slot are the top-K base logits, except that the token of the greedy
    full-vocabulary Markov chain always takes the last place when the top-K lacks it: the chain
    is n small matmuls, and with its token present the greedy walk (which, having followed the
    chain to slot i-1, scores slot i's candidates exactly as the chain scores the vocabulary)
    picks the chain at every K. Base top-K alone loses the chain whenever the Markov bias moves
    the argmax (measured on a bias-dominated drafter: acceptance 1.3 at K=8 against 4.5 for the
    chain).

    With a pruned vocabulary, logits and W2 rows are draft ids; `to_target` maps the candidates
    to the target ids the lattice carries (and W1 reads).

    Under tensor parallelism (`head.vocab` a shard, `logits` this rank's shard) the top-K is
    global, the chain's argmax is global, and each rank scores the candidates whose W2 rows it
    holds; one all-reduce sums them."""
    ops = head.vocab
    unary, cand = ops.topk(logits, k)                                     # [b, n, K]
    chain = greedy_chain(logits, anchor, head, to_target)                 # [b, n] draft ids
    missing = ~(cand == chain[..., None]).any(-1)                         # [b, n]
    chain_logit = ops.at(logits, chain)                                   # [b, n]
    cand = torch.cat([cand[..., :-1], torch.where(missing, chain, cand[..., -1])[..., None]], dim=-1)
    unary = torch.cat([unary[..., :-1], torch.where(missing, chain_logit, unary[..., -1])[..., None]], dim=-1)
    cand_ids = cand if to_target is None else to_target(cand)            # [b, n, K] target ids
    pred_embed = head.markov_w1(predecessors(anchor, cand_ids)).float()   # [b, n, K, r]
    succ = ops.rows(head.markov_w2.weight, cand)                          # [b, n, K, r]
    edges = ops.reduce(torch.einsum("bipr,bijr->bipj", pred_embed, succ))
    return Lattice(cand_ids, unary[:, :, None, :] + edges)


def lattice(drafter, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor, top_k: int) -> Lattice:
    return dspark_lattice(logits, anchor, drafter.markov_head, top_k, drafter.to_target)


def propose(drafter, hidden: torch.Tensor, anchor: torch.Tensor, params: SamplingParams,
            generator: torch.Generator | None) -> Proposal:
    """Draft-slot hidden [b, n, D] -> the Markov chain's tokens and the confidence of each slot."""
    cfg = drafter.config
    # [b, n, V]; a vocab-sharded head (tensor parallelism) reads only this rank's logit shard
    logits = drafter.logits(hidden, shard=drafter.markov_head.vocab.sharded)
    to_target = drafter.to_target if cfg.pruned_vocab else None
    tokens, probs, embeds = markov_chain(logits, anchor, drafter.markov_head, params, generator, to_target)
    probs = None if probs is None else drafter.to_target_vocab(probs)
    confidence = None
    if cfg.heads.enable_confidence_head:
        conf_logits = drafter.confidence_head(hidden, embeds if cfg.heads.confidence_head_with_markov else None)
        confidence = torch.sigmoid(conf_logits)
    return Proposal(tokens, probs, confidence)


def forced_logits(drafter, logits: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """Teacher-forced slot logits [N, V]: the Markov bias read at the true previous tokens [N]."""
    return logits + drafter.markov_head(prev)[0]


def check(cfg) -> None:
    heads = cfg.heads
    if heads is None or heads.markov_rank <= 0:
        raise ConfigError(f"markov_rank={0 if heads is None else heads.markov_rank}: DSpark needs a Markov head "
                          "of rank > 0")
    if heads.markov_head_type != "vanilla":
        raise ConfigError(f"markov_head_type={heads.markov_head_type!r} is not implemented (only 'vanilla'); "
                          "refusing to run it as vanilla")


def _heads_switched_on(read) -> list[str]:
    """`field=value` for each of HEAD_FIELDS that `read(field)` gives set."""
    return [f"{name}={value}" for name in HEAD_FIELDS if (value := read(name))]


def evidence(read, shapes: dict) -> list[str]:
    """Head tensors in the weights, or a Markov rank / confidence head switched on in the config."""
    return [n for n in shapes if n.startswith(("markov_head.", "confidence_head."))] + _heads_switched_on(read)


def heads_from(read, shapes: dict) -> DSparkHeads:
    """The head settings from a published config (`read(field, default)`) and its tensor shapes, which
    must agree."""
    return DSparkHeads(
        markov_rank=_markov_rank(read("markov_rank", None), shapes),
        markov_head_type=str(read("markov_head_type", "vanilla")),
        enable_confidence_head=bool(read("enable_confidence_head", False)) or "confidence_head.proj.weight" in shapes,
        confidence_head_with_markov=bool(read("confidence_head_with_markov", True)),
        confidence_bias="confidence_head.proj.bias" in shapes or not shapes,
    )


def _markov_rank(configured, shapes: dict) -> int:
    w1 = shapes.get("markov_head.markov_w1.weight")
    w2 = shapes.get("markov_head.markov_w2.weight")
    if (w1 is None) != (w2 is None):
        raise ConfigError("Markov head is incomplete: need both markov_w1 and markov_w2 "
                          f"(found markov_w1={w1}, markov_w2={w2})")
    if w1 is None:
        return 0 if configured is None else int(configured)
    rank = w1[1]
    if rank == 0 or w2[1] == 0:
        raise ConfigError(f"Markov head weights resolve to rank 0 (markov_w1 {w1}, markov_w2 {w2}); "
                          "refusing to drop the head")
    if w2[1] != rank:
        raise ConfigError(f"markov_w1 rank {rank} != markov_w2 rank {w2[1]}")
    if configured is not None and int(configured) != rank:
        raise ConfigError(f"markov_rank={configured} in config but the weights have rank {rank}")
    return rank


def add_heads(drafter: nn.Module, cfg) -> None:
    heads = cfg.heads
    drafter.markov_head = MarkovHead(cfg.vocab_size, heads.markov_rank, cfg.output_vocab_size)
    if heads.enable_confidence_head:
        extra = heads.markov_rank if heads.confidence_head_with_markov else 0
        drafter.confidence_head = ConfidenceHead(cfg.hidden_size + extra, heads.confidence_bias)


def published(cfg) -> dict:
    """DeepSeek DeepSpec's layout: top-level keys."""
    return {"architectures": ["Qwen3DSparkModel"], "target_layer_ids": list(cfg.target_layer_ids),
            "mask_token_id": cfg.mask_token_id, "markov_rank": cfg.heads.markov_rank,
            "enable_confidence_head": cfg.heads.enable_confidence_head,
            "confidence_head_with_markov": cfg.heads.confidence_head_with_markov}


class ShardedMarkovHead(MarkovHead):
    """DSpark Markov head with W2 split by vocabulary: forward (MarkovHead's) gives this rank's bias shard
    [.., V/tp]."""

    def __init__(self, full: MarkovHead, tp: TPGroup):
        nn.Module.__init__(self)             # not MarkovHead.__init__: it would build full-size weights
        self.lo, self.hi = tp.split(full.markov_w2.weight.shape[0])
        self.vocab = ShardedVocab(tp, self.lo, self.hi)
        self.markov_w1 = full.markov_w1                                               # replicated [V, r]
        self.markov_w2 = nn.Linear(full.markov_w2.in_features, self.hi - self.lo, bias=False)
        self.markov_w2.weight = nn.Parameter(full.markov_w2.weight.detach()[self.lo:self.hi].clone(),
                                             requires_grad=False)


def shard(drafter, tp: TPGroup) -> None:
    """Tensor parallelism: W1 replicated, W2 split by vocabulary."""
    drafter.markov_head = ShardedMarkovHead(drafter.markov_head, tp)


def _loss(drafter, block, gamma: float):
    from ..train.losses import dspark_loss        # training code loads only when a drafter trains

    return dspark_loss(drafter, block, gamma=gamma)


KIND = DrafterKind(
    name=NAME, title="DSpark",
    architectures=("Qwen3DSparkModel", "DSparkDraftModel", "Lfm2DSparkDraftModel", "DSparkSpeculator"),
    architecture_hint="DSpark",
    shift_label=True, tap_point="layer_output",
    check=check, add_heads=add_heads, propose=propose, publish=published, lattice=lattice,
    forced_logits=forced_logits,
    heads=DSparkHeads, heads_from=heads_from, spellings=SPELLINGS,
    fresh=lambda markov_rank: DSparkHeads(markov_rank, enable_confidence_head=True),
    evidence=evidence,
    tensor_spellings={
        "markov_head.markov_w1.weight": ("markov_head.markov_w1.weight", "markov_w1.weight"),
        "markov_head.markov_w2.weight": ("markov_head.markov_w2.weight", "markov_w2.weight"),
        "confidence_head.proj.weight": ("confidence_head.proj.weight", "confidence_proj.weight"),
        "confidence_head.proj.bias": ("confidence_head.proj.bias", "confidence_proj.bias"),
    },
    vocab_rows=("markov_head.markov_w2.weight",),
    shard=shard,
    onnx=OnnxExport(),
    training=Training(_loss, distills=True),
)
