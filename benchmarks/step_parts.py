"""Where a target pass spends its time: exclusive wall time per part, by timing the functions that do
each part (patched for the measurement only, restored after).

Parts: the weight-only or bf16 linear layers, the LM head, attention, the fused C decoder layers of a
quantized Llama/Qwen3 target (linear layers and attention in one call; with the final norm and LM head
where every row's logits are wanted), a quantized LFM2's short-conv layers run in one C call each (norms,
linear layers and the conv), the Gated DeltaNet recurrence,
the short / causal convolutions, and the state commit after the pass (the kept rows' state, replayed or
gathered on a rollback). A part called inside another counts only in the inner one; what no part
covers (norms, elementwise ops, RoPE, masks, Python between the calls) is `other`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import defaultdict


class PartTimer:
    """Exclusive milliseconds per part over the calls made while `patched` is active."""

    def __init__(self):
        self.ms: dict[str, float] = defaultdict(float)
        self._children: list[float] = []

    def wrap(self, part, fn):
        """`fn` timed as `part` (a name, or a function of the call's arguments giving one)."""
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            self._children.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                inner = self._children.pop()
                self.ms[part(*args, **kwargs) if callable(part) else part] += 1e3 * (spent - inner)
                if self._children:
                    self._children[-1] += spent
        return timed

    @contextlib.contextmanager
    def patched(self, model):
        """Time `model`'s parts (its LM head apart from its other linear layers) until the block exits."""
        from blockdraft.layers import attention, cpu_kernels, deltanet, linear, quant

        head = getattr(model, "lm_head", None)

        def linear_part(name):
            return lambda layer, *_, **__: "LM head" if layer is head else name

        patches = [(quant.QuantizedLinear, "forward", linear_part("linear layers (int4/int8)")),
                   (linear.StableLinear, "forward", linear_part("linear layers (bf16)")),
                   (cpu_kernels.LayerStack, "run", lambda *_, head=None, **__: (
                       "decoder layers (fused C: linear + attention)" if head is None
                       else "decoder layers, final norm and LM head (fused C)"))]
        by_function = {attention.attend: "attention", deltanet.delta_rule: "DeltaNet recurrence",
                       deltanet.causal_conv: "short / causal conv", cpu_kernels.short_conv: "short / causal conv",
                       cpu_kernels.conv_layer: "short-conv layers (one C call: norms, linear layers, conv)"}
        for module in [m for name, m in sys.modules.items() if name.startswith("blockdraft.")]:
            for attr, value in list(vars(module).items()):
                if callable(value) and value in by_function:
                    patches.append((module, attr, by_function[value]))
        saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patches]
        try:
            for owner, attr, part in patches:
                setattr(owner, attr, self.wrap(part, getattr(owner, attr)))
            yield self
        finally:
            for owner, attr, original in saved:
                setattr(owner, attr, original)


def pass_parts(run_pass, commit, model, repeats: int) -> dict[str, float]:
    """Median ms per part of `run_pass()` followed by `commit()` (the state commit part), over `repeats`
    calls, with `other` = the pass's wall time not in any part and `total` its wall time."""
    import statistics

    rounds = []
    for _ in range(repeats):
        timer = PartTimer()
        with timer.patched(model):
            t0 = time.perf_counter()
            run_pass()
            t1 = time.perf_counter()
            parts = dict(timer.ms)                 # the pass's parts; the commit below counts as one
            commit()
            t2 = time.perf_counter()
        parts["other"] = 1e3 * (t1 - t0) - sum(parts.values())
        parts["state commit"] = 1e3 * (t2 - t1)
        parts["total"] = 1e3 * (t2 - t0)
        rounds.append(parts)
    names = {n for r in rounds for n in r}
    return {n: statistics.median(r.get(n, 0.0) for r in rounds) for n in sorted(names)}
