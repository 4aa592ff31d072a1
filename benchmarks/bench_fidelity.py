"""How close each numerics is to the exact model: top-1 agreement with fp32, teacher-forced.

For each chat prompt, fp32 decodes greedily; every numerics then scores the same sequence in one
pass, and at every generated position we compare its argmax with fp32's and measure the KL
divergence of its next-token distribution from fp32's. The quantized targets run with blockdraft's
own kernel and, for comparison, PyTorch's (`quantize_target(..., kernel="torch")`); int4-a8 is the own
kernel's int4 with 8-bit activations (an explicit numerics choice, no PyTorch counterpart). Writes
benchmarks/results/fidelity.json.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from results_io import write_results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(1)

    import blockdraft
    from blockdraft.bench.prompt_sets import load_set
    from blockdraft.default_model import smollm2_dir
    from blockdraft.layers.quant import kernels_in, quantize_target, scheme_of
    from blockdraft.loading import load_target

    llm = blockdraft.LLM(drafter="none", dtype="float32")          # the exact model: fp32, unquantized
    exact = llm.target
    prompts = [llm.tokenizer.encode_chat([{"role": "user", "content": t}]) for t in load_set("chat", args.prompts)]
    outs = llm.generate(prompt_token_ids=prompts,
                        sampling_params=blockdraft.SamplingParams(max_tokens=args.tokens, ignore_eos=True))
    sequences = [(list(p) + list(o.token_ids), len(p)) for p, o in zip(prompts, outs)]   # fp32 greedy
    with torch.inference_mode():
        reference = [exact.logits(ids)[0, n - 1:-1].double().log_softmax(-1) for ids, n in sequences]

    def quantized(scheme: str, kernel: str | None):
        return quantize_target(load_target(smollm2_dir(), "bfloat16"), scheme, kernel)

    candidates = {"bf16": lambda: load_target(smollm2_dir(), "bfloat16")}
    for scheme in ("int8", "int4"):
        candidates[f"{scheme} (own kernel)"] = lambda s=scheme: quantized(s, None)
        candidates[f"{scheme} (PyTorch kernel)"] = lambda s=scheme: quantized(s, "torch")
    candidates["int4-a8 (own kernel, 8-bit activations)"] = lambda: quantized("int4-a8", None)
    report = {"prompts": args.prompts, "tokens": args.tokens, "numerics": {}}
    for name, make in candidates.items():
        model = make()
        agree, kl = [], []
        with torch.inference_mode():
            for (ids, n), ref in zip(sequences, reference):
                logp = model.logits(ids)[0, n - 1:-1].double().log_softmax(-1)
                agree.append((logp.argmax(-1) == ref.argmax(-1)).double().mean().item())
                kl.append((ref.exp() * (ref - logp)).sum(-1).mean().item())
        report["numerics"][name] = {"top1_agreement_with_fp32": statistics.mean(agree),
                                    "mean_kl_from_fp32": statistics.mean(kl),
                                    "kernel": kernels_in(model) if scheme_of(model) != "none" else None}
        print(f"{name}: top-1 agreement {statistics.mean(agree):.4f}, KL {statistics.mean(kl):.5f}", flush=True)
    write_results("fidelity", report)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
