"""Weight-only quantized linear layers for the CPU: int4 and int8 in groups of 32, 8-bit LM head.

The weights are stored quantized and multiplied by blockdraft's own kernel (`layers/cpu_kernels.py`:
the GGUF block formats Q4_1 and Q8_0 against activations carried per row at 16 bits in groups of 32,
integer dot products; built with the system C compiler at first use). Decoding a small model on a
CPU is memory-bound, and 4 bits read an eighth of the bytes of bf16; extra rows are compute-bound
(16-bit activations: two integer dot products per weight and row), so a 9-row SmolLM2 verify step
costs several one-row steps, more without VNNI (`benchmarks/bench_costs.py`; figures in
docs/numerics.md). Every row runs the same operations whatever the row count (checked at every
row count by `tests/models/test_quantized.py`), so speculation stays lossless *against the
quantized model*.
A quantized model is a different model from its bf16 source: its greedy text differs, and the
benchmark reports both.

int4 uses the Q4_1 grid (per 32 weights: w = d·q + m, q in 0..15, d and m in fp16) — the format
the default model ships in as a GGUF — so re-quantizing its dequantized weights finds the same
levels. The LM head keeps 8 bits in groups of 32 (`int8_g32`: the GGUF's Q8_0 layout, w = d·q,
q in -127..127), the precision 4-bit GGUFs keep it at; `int8` is that format for every layer.

`int4-a8` is int4 with the activations carried at 8 bits per group of 32 instead of 16 (every layer, the
LM head included), as llama.cpp's Q4_1 x Q8_1 and ONNX Runtime's int4 CPU path compute: one integer dot
product per weight and row instead of two, so extra rows cost about half as much (one AMX tile product
serves 16 rows), at a measured loss of fidelity (`benchmarks/bench_costs.py fidelity`; docs/numerics.md). It is
an explicit choice, never a default; speculation is as lossless against it as against int4. It needs
blockdraft's own kernel (no PyTorch fallback computes it).

Where the kernel cannot be built (no C compiler) or a weight's shape does not fit it (output
width not a multiple of 16, input width not a multiple of 32), the layer falls back to PyTorch's
weight-only kernels (`torch._weight_int4pack_mm_for_cpu`, `torch._weight_int8pack_mm`: int8 per
output channel, bf16 scales, bf16 activations), which are row-invariant too but slower, and the
numerics report names the kernel in use (`kernel`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from . import cpu_kernels as kernels
from .direct import DirectCall
from .hugepages import weight_buffer
from .mlp import MLP
from .moe import Experts
from .norm import RMSNorm

SCHEMES = ("none", "int8", "int4", "int4-a8")   # what a user picks; int8_g32 is the LM head of each
INT4_GROUP = 32
A8 = "-a8"                                  # scheme suffix: 8-bit activations


def act_bits_of(scheme: str) -> tuple[str, int]:
    """A layer scheme -> (its weight format, the bits its activations are carried at): "int4-a8" -> ("int4", 8)."""
    return (scheme.removesuffix(A8), 8) if scheme.endswith(A8) else (scheme, 16)


def head_scheme(scheme: str, in_features: int) -> str:
    """The LM head's scheme under a model's `scheme`: 8 bits in groups of 32 where the width allows, per
    channel otherwise, with the model's activation bits."""
    head = "int8_g32" if in_features % INT4_GROUP == 0 else "int8"
    return head + A8 if act_bits_of(scheme)[1] == 8 else head


def check_scheme(scheme: str | None, dtype: torch.dtype, device: str | torch.device = "cpu") -> str:
    scheme = scheme or "none"
    if scheme not in SCHEMES:
        raise ConfigError(f"quantization {scheme!r} is not supported (choose from {', '.join(SCHEMES)})")
    if scheme != "none":
        if torch.device(device).type != "cpu":
            raise ConfigError(f"quantization={scheme} uses PyTorch's CPU weight-only kernels; on {device} use "
                              "quantization=none")
        if dtype != torch.bfloat16:
            raise ConfigError(f"quantization={scheme} runs with bf16 activations; dtype is "
                              f"{str(dtype).removeprefix('torch.')} (use --dtype bfloat16 or auto)")
    return scheme


class QuantizedLinear(DirectCall):
    """y = x · dequant(W)ᵀ (+ b), W stored in `scheme` for `kernel` ("qgemm": blockdraft's own, where it
    builds and the shape fits; "torch": PyTorch's weight-only kernels; None: the first that applies)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, scheme: str, kernel: str | None = None):
        super().__init__()
        out_features, in_features = weight.shape
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        fmt, self.act_bits = act_bits_of(scheme)
        if fmt not in ("int8", "int4", "int8_g32"):
            raise ConfigError(f"QuantizedLinear scheme {scheme!r} (choose int8, int4 or int8_g32, each optionally {A8})")
        self.bits = 4 if fmt == "int4" else 8
        packed = None
        if kernel != "torch" and kernels.available() and kernels.supports(out_features, in_features):
            try:
                packed, scales = kernels.pack(weight, self.bits)
            except ValueError:              # scales beyond fp16: PyTorch's kernels keep bf16 ones
                packed = None
        if packed is None and self.act_bits == 8:
            raise ConfigError(f"quantization {scheme!r}: 8-bit activations run on blockdraft's own kernel only, which "
                              f"cannot take this {out_features} x {in_features} weight (built: {kernels.available()}; "
                              "needs out % 16 == 0, in % 32 == 0, fp16 scales); use int4")
        if packed is None and kernel == "qgemm":
            raise ConfigError(f"the qgemm kernel cannot take this {out_features} x {in_features} weight "
                              f"(built: {kernels.available()}; needs out % 16 == 0, in % 32 == 0, fp16 scales)")
        self.kernel = "torch" if packed is None else "qgemm"
        if packed is not None:
            self.register_buffer("qweight", weight_buffer(packed))        # on 2 MiB pages where it fills them
            self.register_buffer("scales", weight_buffer(scales))
        else:
            self._torch_weights(weight.detach().float())
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.bfloat16), requires_grad=False)

    def _torch_weights(self, w: torch.Tensor) -> None:
        """PyTorch's layouts: int8 per output channel; int4 / two int4 halves (int8_g32) in groups of 32."""
        out_features, in_features, scheme = self.out_features, self.in_features, self.scheme
        if scheme == "int8":
            scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)                              # [out]
            self.register_buffer("qweight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
            self.register_buffer("scales", scale.to(torch.bfloat16))
            return
        if in_features % INT4_GROUP:
            raise ConfigError(f"quantization={scheme} needs in_features divisible by {INT4_GROUP}, got {in_features}")
        groups = w.view(out_features, in_features // INT4_GROUP, INT4_GROUP)                  # [out, in/32, 32]
        if scheme == "int4":
            low, high = groups.amin(-1), groups.amax(-1)                                      # [out, in/32]
            scale = ((high - low) / 15).clamp_min(1e-12)
            q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
            self.register_buffer("qweight", _pack_int4(q))
            # the kernel computes (q - 8) · scale + zero, so zero = low + 8 · scale
            self.register_buffer("scales", _scales_and_zeros(scale, low + 8 * scale))
            return
        scale = (groups.abs().amax(-1) / 127).clamp_min(1e-12).to(torch.bfloat16).float()       # [out, in/32]
        q = torch.round(groups / scale[..., None]).clamp(-127, 127).to(torch.int32)
        hi = torch.div(q, 16, rounding_mode="floor")                                          # -8..7
        self.register_buffer("qweight", _pack_int4(hi + 8))
        self.register_buffer("qweight_lo", _pack_int4(q - 16 * hi))                           # 0..15
        # (hi + 8 - 8) · 16d + 0 and (lo - 8) · d + 8d: both exact multiples of the bf16 scale
        self.register_buffer("scales", _scales_and_zeros(16 * scale, torch.zeros_like(scale)))
        self.register_buffer("scales_lo", _scales_and_zeros(scale, 8 * scale))

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight (bf16), for code that reads a head's rows (e.g. a drafter copying them)."""
        if self.kernel == "qgemm":
            return kernels.dequantize(self.qweight, self.scales, self.bits, self.out_features,
                                    self.in_features).to(torch.bfloat16)
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return self._mm(eye).T.contiguous()

    def _mm(self, flat: torch.Tensor) -> torch.Tensor:
        if self.kernel == "qgemm":
            return kernels.matmul(flat, self.qweight, self.scales, self.bits, self.out_features,
                                  act_bits=self.act_bits)
        if self.scheme == "int8":
            return torch._weight_int8pack_mm(flat, self.qweight, self.scales)
        out = torch._weight_int4pack_mm_for_cpu(flat, self.qweight, INT4_GROUP, self.scales)
        if self.scheme == "int8_g32":      # the low nibbles' product, added in fp32
            lo = torch._weight_int4pack_mm_for_cpu(flat, self.qweight_lo, INT4_GROUP, self.scales_lo)
            out = (out.float() + lo.float()).to(flat.dtype)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])                                                    # [rows, in]
        if flat.dtype != torch.bfloat16:
            flat = flat.to(torch.bfloat16)
        if not flat.is_contiguous():
            flat = flat.contiguous()
        out = self._mm(flat)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features)


def _pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[out, in/32, 32] values 0..15 -> the int4 kernel's packed weight."""
    return torch._convert_weight_to_int4pack_for_cpu(q.reshape(q.shape[0], -1), 1)


def _scales_and_zeros(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """[out, in/32] scale and zero -> the int4 kernel's [in/32, out, 2] bf16 table."""
    return torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(torch.bfloat16)


QKV, GATE_UP = ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")     # projections of one input, fused


def _fused(parent: nn.Module, names: tuple[str, ...], scheme: str, kernel: str | None) -> QuantizedLinear:
    """One weight-only layer for several projections of the same input (rows quantize on their
    own, so fusing changes no weight); the originals are dropped."""
    parts = [getattr(parent, n) for n in names]
    bias = None if parts[0].bias is None else torch.cat([p.bias for p in parts])
    fused = QuantizedLinear(torch.cat([p.weight for p in parts]), bias, scheme, kernel)
    for n in names:
        delattr(parent, n)
    return fused


def quantize_target(model: nn.Module, scheme: str, kernel: str | None = None) -> nn.Module:
    """Replace the target's projections and LM head with `scheme` weight-only layers, in place
    (q/k/v and gate/up fused: fewer kernel calls per step); the embedding stays bf16 (a lookup).
    `kernel` as `QuantizedLinear` takes it (None: the own kernel where it applies)."""
    if scheme == "none":
        return model
    from ..models.registry import family_of          # the families' layers import this module

    if not family_of(model.config.architecture).capabilities.fused_layer_stack:
        return _quantize_hybrid(model, scheme, kernel)
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = _fused(attn, QKV, scheme, kernel)
        attn.o_proj = QuantizedLinear(attn.o_proj.weight, attn.o_proj.bias, scheme, kernel)
        mlp.gate_up_proj = _fused(mlp, GATE_UP, scheme, kernel)
        mlp.down_proj = QuantizedLinear(mlp.down_proj.weight, mlp.down_proj.bias, scheme, kernel)
    fused = [_fused_layer(layer) for layer in model.layers]
    model.fused = kernels.LayerStack(fused) if None not in fused else None
    # the LM head stays at 8 bits, in groups of 32: the precision 4-bit GGUFs keep it at (the default
    # model's tied embedding / head is Q8_0)
    model.lm_head = QuantizedLinear(model.lm_head.weight, None, head_scheme(scheme, model.lm_head.weight.shape[1]),
                                    kernel)
    if model.fused is not None:
        model.fused.head = _fused_head(model.norm, model.lm_head, model.config.final_logit_softcapping)
    return model


def _fused_head(norm: nn.Module, head: QuantizedLinear, softcap: float | None) -> kernels.HeadWeights | None:
    """The final norm and LM head for `cpu_kernels.LayerStack`, where its kernels take both: a plain RMSNorm
    and a packed head without bias, no logit softcapping."""
    if (type(norm) is not RMSNorm or norm.weight.dtype != torch.bfloat16 or norm.weight.shape[0] % 16
            or head.kernel != "qgemm" or head.bias is not None or softcap is not None):
        return None
    return kernels.HeadWeights((norm, head), norm.weight, norm.eps, head.qweight, head.scales, head.bits,
                               head.act_bits, head.out_features)


class QuantizedExperts(nn.Module):
    """A MoE block's stacked experts (`moe.Experts`) as one `scheme` weight-only layer per expert and
    projection, biases kept: what `mix_experts` runs, reading an expert's weights only for its rows."""

    def __init__(self, ex: Experts, scheme: str, kernel: str | None):
        super().__init__()

        def per_expert(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.ModuleList:
            return nn.ModuleList(QuantizedLinear(weight[e], None if bias is None else bias[e], scheme, kernel)
                                 for e in range(weight.shape[0]))
        self.gate_up_e = per_expert(ex.gate_up_proj, ex.gate_up_proj_bias)      # [2I, H] each
        self.down_e = per_expert(ex.down_proj, ex.down_proj_bias)               # [H, I] each

    def gate_up(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return self.gate_up_e[e](x)

    def down(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return self.down_e[e](x)


def _quantize_hybrid(model: nn.Module, scheme: str, kernel: str | None) -> nn.Module:
    """Targets with state layers (Qwen3.5, LFM2) or MoE: every projection whose shape the kernels take (out a
    multiple of 16, in of 32) as `scheme` (an attention layer's q, k and v, and a dense MLP's gate and up, as
    one projection each), the stacked experts one layer per expert (`QuantizedExperts`, where both
    projections' shapes fit); the small ones (DeltaNet's b/a heads, the shared-expert gate) and the router
    stay bf16. The layers run one by one (no fused stack: the per-sequence state is not in it)."""
    from ..models.decoder import TargetAttention      # the models import this module

    for layer in model.layers:       # q/k/v and gate/up as one projection each, as quantize_target fuses them
        mlp, attn = getattr(layer, "mlp", None), getattr(layer, "self_attn", None)
        if (isinstance(mlp, MLP) and mlp.gate_up_proj is None and mlp.gate_proj.bias is None
                and kernels.supports(2 * mlp.gate_proj.out_features, mlp.gate_proj.in_features)):
            mlp.gate_up_proj = _fused(mlp, GATE_UP, scheme, kernel)
        if (type(attn) is TargetAttention and attn.qkv_proj is None
                and kernels.supports(sum(getattr(attn, n).out_features for n in QKV), attn.q_proj.in_features)):
            attn.qkv_proj = _fused(attn, QKV, scheme, kernel)
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear) and kernels.supports(child.out_features, child.in_features):
                    setattr(parent, name, QuantizedLinear(child.weight, child.bias, scheme, kernel))
                elif (isinstance(child, Experts) and kernels.supports(*child.gate_up_proj.shape[1:])
                      and kernels.supports(*child.down_proj.shape[1:])):
                    setattr(parent, name, QuantizedExperts(child, scheme, kernel))
    model.lm_head = QuantizedLinear(model.lm_head.weight, None, head_scheme(scheme, model.lm_head.weight.shape[1]),
                                    kernel)
    model.fused = None
    return model


def _fused_layer(layer: nn.Module) -> kernels.LayerWeights | None:
    """The layer's weights for `cpu_kernels.LayerStack`, where its kernels take the whole layer."""
    attn, mlp = layer.self_attn, layer.mlp
    projections = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    norms = (layer.input_layernorm, layer.post_attention_layernorm, *([attn.q_norm, attn.k_norm] if attn.qk_norm else []))
    if (any(m.kernel != "qgemm" or m.bias is not None for m in projections) or not kernels.head_fits(attn.head_dim)
            or len({n.eps for n in norms}) > 1):
        return None
    return kernels.LayerWeights(
        layer.input_layernorm.weight, layer.post_attention_layernorm.weight, layer.input_layernorm.eps,
        *((m.qweight, m.scales) for m in projections),
        (attn.q_norm.weight, attn.k_norm.weight) if attn.qk_norm else None,
        attn.qkv_proj.bits, attn.qkv_proj.act_bits, attn.num_heads, attn.num_kv_heads, attn.head_dim, mlp.down_proj.in_features)


def scheme_of(model: nn.Module) -> str:
    """The weight scheme of a target's or drafter's layers, as `quantize_target` / `quantize_drafter` was given it
    ("none" where no layer is quantized; the LM head's 8-bit scheme is the head's own, not the model's)."""
    head = getattr(model, "lm_head", None)
    return next((m.scheme for m in model.modules() if isinstance(m, QuantizedLinear) and m is not head), "none")


def kernels_in(model: nn.Module) -> str:
    """Which kernels the model's quantized layers run, e.g. "qgemm avx512vnni" or "qgemm avx2 + torch"."""
    names = {m.kernel for m in model.modules() if isinstance(m, QuantizedLinear)}
    return " + ".join(f"qgemm {kernels.best_isa()}" if k == "qgemm" else k for k in sorted(names))


def quantize_drafter(drafter: nn.Module, scheme: str) -> nn.Module:
    """The drafter's projections in its target's weight-only scheme, in place: `fc`, every layer's
    q/k/v/o and gate/up (fused)/down at `scheme`, its own LM head at 8 bits in groups of 32. Only
    layers blockdraft's own kernel takes are converted (the small heads — Markov, confidence,
    selector, convolution kernels — and any odd shape stay in the activation dtype). A quantized
    drafter drafts differently; verification, and so the output, is unchanged."""
    if scheme == "none" or not kernels.available() or drafter.dtype != torch.bfloat16:
        return drafter

    def convert(parent: nn.Module, name: str, layer_scheme: str = scheme) -> None:
        m = getattr(parent, name)
        w = getattr(m, "weight", None)
        if isinstance(m, nn.Linear) and w is not None and kernels.supports(*w.shape):
            setattr(parent, name, QuantizedLinear(w, m.bias, layer_scheme, "qgemm"))

    convert(drafter, "fc")
    for layer in drafter.layers:
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            convert(layer.self_attn, name)
        mlp = layer.mlp
        if kernels.supports(2 * mlp.gate_proj.out_features, mlp.gate_proj.in_features):
            mlp.gate_up_proj = _fused(mlp, GATE_UP, scheme, "qgemm")
        convert(mlp, "down_proj")
    if drafter.config.own_lm_head:
        convert(drafter, "lm_head", head_scheme(scheme, INT4_GROUP))
    return drafter
