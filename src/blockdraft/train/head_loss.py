"""DSpark's distillation loss over the draft vocabulary, a chunk of rows at a time, its gradients
computed in the same pass (the fused-linear-loss pattern): no [N, vocab] tensor outlives its chunk.

Per row: z = h·Wᵀ + e·W2ᵀ (the LM head and the Markov bias), q = softmax(z); CE = −log q[label]
(0 where the draft vocabulary lacks the label) and the top-k L1 of `losses.topk_l1`. The loss is
Σ w·(α_ce·CE + α_l1·L1) / Σ w. Autograd over the same expression (losses.dspark_loss's reference
path) keeps several [N, vocab] fp32 tensors for its backward — at the teacher cache's ~2,000 rows
a sequence and 12,288 draft ids, ~100 MB each, written, read back and freshly allocated every
step, most of a training step's time. Here each chunk's z, q and dL/dz live in cache-sized
buffers and are reduced at once into the gradients of h, W, e and W2; backward only scales them.

The head's and the Markov bias's products run in `head_dtype` / `markov_dtype` (bf16 under autocast, as
autocast would run them: bf16 operands, bf16 products; gradient chunks summed in fp32 here) and every
elementwise step in fp32.
"""

from __future__ import annotations

import torch

CHUNK_ROWS = 128          # rows per chunk: [128, 12288] fp32 is 6 MiB, a few such buffers stay in cache


def _mm(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a @ b with operands (and, for bf16, the product) in `dtype`, returned in fp32."""
    return torch.mm(a.to(dtype), b.to(dtype)).float()


class _DraftHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, head_w, embed, markov_w2, labels, covered, topk_ids, topk_probs, weight,
                ce_alpha, l1_alpha, head_dtype, markov_dtype, chunk_rows):
        with torch.autocast("cpu", enabled=False):       # the dtypes below are chosen, not autocast's
            return _DraftHeadLoss._forward(ctx, hidden, head_w, embed, markov_w2, labels, covered, topk_ids,
                                           topk_probs, weight, ce_alpha, l1_alpha, head_dtype, markov_dtype,
                                           chunk_rows)

    @staticmethod
    def _forward(ctx, hidden, head_w, embed, markov_w2, labels, covered, topk_ids, topk_probs, weight,
                 ce_alpha, l1_alpha, head_dtype, markov_dtype, chunk_rows):
        n = hidden.shape[0]
        need = ctx.needs_input_grad[:4]                                     # hidden, head_w, embed, markov_w2
        grads = any(need)
        denom = weight.float().sum().clamp_min(1e-6)
        dl_dce = ce_alpha * weight.float() / denom                          # [N] dLoss/dCE per row
        dl_dl1 = l1_alpha * weight.float() / denom
        named = topk_ids >= 0                                               # [N, k]
        ids = topk_ids.clamp_min(0)
        p = topk_probs.float()
        off_vocab = (p * ~named).sum(-1)
        target_rest = (1 - p.sum(-1)).clamp_min(0)
        ce, l1 = torch.empty(n), torch.empty(n)
        w_c, w2_c = head_w.to(head_dtype), markov_w2.to(markov_dtype)
        g_h, g_e = torch.empty(n, hidden.shape[1]) if need[0] else None, torch.empty(n, embed.shape[1]) if need[2] else None
        g_w, g_w2 = torch.zeros(head_w.shape) if need[1] else None, torch.zeros(markov_w2.shape) if need[3] else None
        for a in range(0, n, chunk_rows):
            b = min(a + chunk_rows, n)
            h, e = hidden[a:b].to(head_dtype), embed[a:b].to(markov_dtype)
            z = _mm(h, w_c.t(), head_dtype)                                 # [c, Vd]
            z += _mm(e, w2_c.t(), markov_dtype)
            z -= torch.logsumexp(z, -1, keepdim=True)                       # log q
            ce[a:b] = -z.gather(1, labels[a:b, None])[:, 0] * covered[a:b]
            q = z.exp_()                                                    # [c, Vd] (z's buffer)
            q_top = q.gather(1, ids[a:b]) * named[a:b]                      # [c, k]
            diff = q_top - p[a:b]
            draft_rest = 1 - q_top.sum(-1)
            rest = draft_rest.clamp_min(0) - target_rest[a:b]
            l1[a:b] = (diff.abs() * named[a:b]).sum(-1) + off_vocab[a:b] + rest.abs()
            if not grads:
                continue
            # dL1/dq on the named ids (|q - p|, and the rest term through 1 - sum), then through softmax:
            # dz = q * (dq - <q, dq>); CE adds q - onehot(label)
            dq = (diff.sign() - (rest.sign() * (draft_rest >= 0))[:, None]) * named[a:b]     # [c, k]
            dq = dq * dl_dl1[a:b, None]
            inner = (q_top * dq).sum(-1, keepdim=True)                                     # [c, 1]
            g_ce = (dl_dce[a:b] * covered[a:b])[:, None]
            g_z = q.mul_(g_ce - inner)                                      # q (g_ce - inner), in q's buffer
            g_z.scatter_add_(1, ids[a:b], q_top * dq)                       # + q dq on the named ids
            g_z.scatter_add_(1, labels[a:b, None], -g_ce)                   # - onehot(label) g_ce
            g, gm = g_z.to(head_dtype), g_z.to(markov_dtype)
            if need[0]:
                g_h[a:b] = _mm(g, w_c, head_dtype)
            if need[1]:
                g_w += _mm(g.t(), h, head_dtype)
            if need[2]:
                g_e[a:b] = _mm(gm, w2_c, markov_dtype)
            if need[3]:
                g_w2 += _mm(gm.t(), e, markov_dtype)
        ctx.grads = (None if g_h is None else g_h.to(hidden.dtype), g_w, None if g_e is None else g_e.to(embed.dtype), g_w2)
        ctx.mark_non_differentiable(ce, l1)
        loss = (dl_dce * ce).sum() + (dl_dl1 * l1).sum()
        return loss, ce, l1

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_l1):
        return (*[None if g is None else g * grad_loss for g in ctx.grads], *[None] * 10)


def draft_head_loss(hidden: torch.Tensor, head_w: torch.Tensor, embed: torch.Tensor, markov_w2: torch.Tensor,
                    labels: torch.Tensor, covered: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor,
                    weight: torch.Tensor, ce_alpha: float, l1_alpha: float,
                    head_dtype: torch.dtype = torch.float32, markov_dtype: torch.dtype = torch.float32,
                    chunk_rows: int = CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, CE [N], L1 [N]) of hidden [N, D] through head_w [Vd, D] plus the Markov bias embed [N, r] ·
    markov_w2 [Vd, r]ᵀ; labels [N] draft ids (covered [N]: 1 where the draft vocabulary holds the label),
    topk_ids [N, k] draft ids (-1: not in the draft vocabulary), topk_probs [N, k], weight [N]. The loss
    is differentiable in hidden, head_w, embed and markov_w2; CE and L1 are values (detached)."""
    return _DraftHeadLoss.apply(hidden, head_w, embed, markov_w2, labels, covered.float(), topk_ids, topk_probs,
                                weight, ce_alpha, l1_alpha, head_dtype, markov_dtype, chunk_rows)
