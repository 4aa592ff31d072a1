"""blockdraft's own CPU kernels (`cpu_kernels.c`), built at first use: a weight-only int4/int8 matmul,
the inference attention, the quantized target's whole layer stack, and a quantized LFM2 short-conv layer.

The matmul multiplies the GGUF block formats — 4-bit Q4_1 (fp16 scale and minimum per 32 weights) and
8-bit Q8_0 — against activations carried per row at 16 bits in groups of 32 (two signed bytes), with
exact integer group sums (AMX tiles, AVX512-VNNI, AVX2, or portable C: the same bits), prefetching the
weights and keeping a tile of rows' sums in registers over a block's groups (up to 9 rows with VNNI, 3 with
AVX2, up to 16 with AMX). On CPUs with AMX (`best_isa() == "amx"`) passes of 6 rows or more (10 with 8-bit
activations) run on the tiles — int8 products (a 9-row pass: 8 rows on the tile, the 9th on VNNI), or for
4-bit weights and 10-16 rows bf16 products whose fp32 sums are exact — so a verify reads each weight once
at a cost per row under the VNNI path's. Its scales stay in fp16 as the GGUF stores them (PyTorch's int4
CPU kernel keeps them in bf16, further from the model). On AVX2, 4-bit products are summed in 16 bits over 32 inputs before widening (no
overflow: 8 pair sums of at most 2*15*128). Every row runs the same operations whatever the row
count, so a verify rounds each row as a one-row step does (`tests/models/test_quantized.py`).

The attention (`attend`) computes each query row on its own over the keys it sees (fp32 scores and
sums in a fixed order, masked keys never read), so its bits do not depend on the other rows or on
masked keys either; it is what bf16 inference on the CPU runs in place of the float64 form of
`layers/attention.py`, at a fraction of its cost.

The quantized target's layers run in C with no Python between them (`LayerStack.run`, one call a
step: per layer RMSNorm, q/k/v, Qwen3's q/k norms, the rotation, the K/V rows written into the step's
cache or paged pool in place, attention reading the keys there through the slots, o_proj + residual,
RMSNorm, gate/up, SwiGLU, down + residual; the drafter's taps copied out), with the bits of the
layers' PyTorch spelling over the same kernels (tested, cache and paged pool). Since SiLU needs an
exp, the PyTorch spelling calls this module's `swiglu` too for bf16 inference. SwiGLU and RMSNorm run
8 lanes wide on AVX2 and 16 on AVX512 (the same operations lane by lane: the same bits), rows of 16,384
elements or more split between threads.

A quantized LFM2 short-conv layer runs in one call (`conv_layer`: RMSNorm, in_proj, the conv and its gates,
out_proj + residual, RMSNorm, gate/up, SwiGLU, down + residual), and bf16 inference runs the conv and its
gates in one call otherwise (`short_conv`), each with the bits of the layer's PyTorch spelling (tested).

The C source is compiled once per machine with the system C compiler (`cc`, or `$CC`) into the
blockdraft cache; where no compiler works (or `BLOCKDRAFT_NO_CPU_KERNELS` is set), `available()` is
False: the quantized layers fall back to PyTorch's kernels and say so, attention to its float64 form.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from .hugepages import weight_buffer
from .linear import cached_on

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
GROUP, COLS = 32, 16
ISAS = {"portable": 0, "avx2": 1, "avx512vnni": 2, "amx": 3}
AMX_LAYOUTS = {"amx-int8": 4, "amx-bf16": 5}   # one tile layout for every pass (tests, benchmarks)


def _cache_dir() -> Path:
    root = os.environ.get("BLOCKDRAFT_CACHE") or Path.home() / ".cache" / "blockdraft"
    return Path(root) / "kernels"


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel (built on first use, cached per source and compiler), or None."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None or os.environ.get("BLOCKDRAFT_NO_CPU_KERNELS"):
        return None
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    digest = hashlib.sha256(source + version.encode()).hexdigest()[:16]
    target = _cache_dir() / f"cpu_kernels-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            cmd = [compiler, "-O3", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", str(SOURCE), "-o", str(built)]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                log.warning("could not build the CPU kernels (%s): %s", " ".join(cmd), run.stderr[-2000:])
                return None
            os.replace(built, target)            # atomic: concurrent builders leave one whole file
    lib = ctypes.CDLL(str(target))
    lib.bd_best_isa.restype = ctypes.c_int
    lib.bd_qgemm.restype = ctypes.c_int
    lib.bd_qgemm.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                             ctypes.c_int]
    lib.bd_attend.restype = ctypes.c_int
    lib.bd_attend.argtypes = [ctypes.c_void_p, *[ctypes.c_int] * 4, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
                              ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    ptr, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    lib.bd_layers.restype = ctypes.c_int
    lib.bd_layers.argtypes = [ptr, ptr, ptr, ptr, i32, i32, i32, ptr, i32, i32, i32, i32, i32, i32, i32, i32, f32, f32,
                              ptr,
                              ptr, ptr, ptr, ptr, ptr, i32, i64, i64, ptr, ptr, ptr, i32, i32]
    lib.bd_swiglu.restype = None
    lib.bd_swiglu.argtypes = [ptr, i64, ptr, i64, i32, i32, ptr, i32, i32]
    lib.bd_rmsnorm.restype = None
    lib.bd_rmsnorm.argtypes = [ptr, i32, i32, ptr, f32, ptr, i32, i32]
    lib.bd_short_conv.restype = ctypes.c_int
    lib.bd_short_conv.argtypes = [ptr, i64, ptr, i32, i32, i32, i32, ptr, ptr, ptr, ptr, i32]
    lib.bd_conv_layer.restype = ctypes.c_int
    lib.bd_conv_layer.argtypes = [ptr, i32, i32, i32, i32, ptr, ptr, f32, *[ptr] * 8, i32, i32, ptr, ptr, ptr, i32, ptr,
                                  i32, i32]
    lib.bd_delta_rule.restype = None
    lib.bd_delta_rule.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, ptr, ptr, ptr, i32]
    lib.bd_markov_bias.restype = None
    lib.bd_markov_bias.argtypes = [ptr, i32, i32, ptr, i32, ptr, i32, i32]
    lib.bd_argmax.restype = None
    lib.bd_argmax.argtypes = [ptr, i32, i32, i64, i32, ptr, i32]
    lib.bd_markov_argmax.restype = ctypes.c_int
    lib.bd_markov_argmax.argtypes = [ptr, i32, i32, ptr, i32, ptr, i64, i32, ptr, i32, i32]
    return lib


def available() -> bool:
    return library() is not None


@functools.cache
def best_isa() -> str:
    lib = library()
    code = lib.bd_best_isa() if lib is not None else 0
    return {v: k for k, v in ISAS.items()}[code]


def _isa_code(isa: str | None) -> int:
    return ISAS[isa] if isa in ISAS else AMX_LAYOUTS[isa] if isa in AMX_LAYOUTS else ISAS[best_isa()]


def supports(out_features: int, in_features: int) -> bool:
    return out_features % COLS == 0 and in_features % GROUP == 0


def pack(weight: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (packed uint8 weight, fp16 scales) in `cpu_kernels.c`'s layout. 4 bits: per 32 inputs
    d = (max - min) / 15, m = min, q = round((w - m) / d) (Q4_1); 8 bits: d = max|w| / 127,
    q = round(w / d) (Q8_0); d and m rounded to fp16 (as GGUF blocks store them) before q is chosen.
    A weight whose scales do not fit fp16 is a ValueError."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // GROUP, GROUP)                          # [N, G, 32]
    blocks, groups = n // COLS, k // GROUP

    def by_block(t: torch.Tensor) -> torch.Tensor:     # [N, G, ...] -> [B, G, 16, ...]
        return t.reshape(blocks, COLS, groups, *t.shape[2:]).transpose(1, 2)

    if bits == 4:
        low, high = w.amin(-1).half().float(), w.amax(-1)                              # [N, G]
        d = ((high - low) / 15).half().float()
        q = torch.round((w - low[..., None]) / torch.where(d > 0, d, 1)[..., None]).clamp(0, 15).to(torch.uint8)
        q = by_block(q).reshape(blocks, groups, COLS, 4, 2, 4).permute(0, 1, 3, 2, 4, 5)   # [B, G, t, c, hi, b]
        packed = q[..., 0, :] | (q[..., 1, :] << 4)                                     # [B, G, 4, 16, 4]
        scales = torch.stack([by_block(d), by_block(low)], dim=2)                      # [B, G, 2, 16]
    elif bits == 8:
        d = (w.abs().amax(-1) / 127).half().float()
        q = torch.round(w / torch.where(d > 0, d, 1)[..., None]).clamp(-127, 127).to(torch.int16) + 128
        packed = by_block(q.to(torch.uint8)).reshape(blocks, groups, COLS, 8, 4).transpose(2, 3)   # [B, G, j, c, b]
        scales = by_block(d)                                                           # [B, G, 16]
    else:
        raise ValueError(f"bits={bits} (4 or 8)")
    if not torch.isfinite(scales).all():
        raise ValueError("weights beyond fp16's range: the kernel keeps scales in fp16")
    return packed.contiguous().view(-1), scales.contiguous().half().view(-1)


def dequantize(packed: torch.Tensor, scales: torch.Tensor, bits: int, n: int, k: int) -> torch.Tensor:
    """The fp32 weight [N, K] that `pack` stored (for code that reads a head's rows)."""
    blocks, groups = n // COLS, k // GROUP
    if bits == 4:
        p = packed.view(blocks, groups, 4, COLS, 4)
        q = torch.stack([p & 15, p >> 4], dim=4).permute(0, 1, 3, 2, 4, 5).reshape(blocks, groups, COLS, GROUP)
        s = scales.float().view(blocks, groups, 2, COLS)
        w = q.float() * s[:, :, 0, :, None] + s[:, :, 1, :, None]
    else:
        q = packed.view(blocks, groups, 8, COLS, 4).transpose(2, 3).reshape(blocks, groups, COLS, GROUP)
        w = (q.to(torch.int16) - 128).float() * scales.float().view(blocks, groups, COLS)[..., None]
    return w.transpose(1, 2).reshape(n, k)


def matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bits: int, n: int,
           isa: str | None = None, residual: torch.Tensor | None = None, act_bits: int = 16) -> torch.Tensor:
    """x [rows, K] bf16 (contiguous) -> [rows, N] bf16, plus `residual` [rows, N] (contiguous) if given;
    `act_bits` 16 (the activations carried at 16 bits per group of 32) or 8 (at 8 bits)."""
    if act_bits not in (8, 16):
        raise ValueError(f"act_bits={act_bits}: the kernel carries activations at 16 or 8 bits")
    lib = library()
    rows, k = x.shape
    out = torch.empty(rows, n, dtype=torch.bfloat16)
    if rows:
        rc = lib.bd_qgemm(x.data_ptr(), rows, k, packed.data_ptr(), scales.data_ptr(), n, bits, act_bits,
                          out.data_ptr(),
                          None if residual is None else residual.data_ptr(), _isa_code(isa),
                          torch.get_num_threads())
        if rc != 0:
            raise MemoryError(f"qgemm: no scratch memory for {rows} x {k} activations")
    return out


def head_fits(head_dim: int) -> bool:
    """Whether the attention kernel takes this head size: a multiple of 16, up to 256."""
    return head_dim % 16 == 0 and head_dim <= 256


def attention_fits(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether `attend` takes these: bf16 on the CPU, a head size `head_fits` takes."""
    return (q.dtype == k.dtype == torch.bfloat16 and q.device.type == "cpu" and head_fits(q.shape[-1])
            and library() is not None)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None,
           scale: float, isa: str | None = None) -> torch.Tensor:
    """q [b, h, tq, d], k/v [b, hkv, tk, d] bf16, visible [b or 1, 1, tq, tk] bool or None -> [b, tq, h*d]."""
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    q = q.contiguous()
    k, v, strides, mask, mask_strides = _keys_and_mask(k, v, visible, b, tq)
    out = torch.empty(b, tq, h * d, dtype=torch.bfloat16)
    rc = library().bd_attend(q.data_ptr(), b, h, tq, d, k.data_ptr(), v.data_ptr(), strides, hkv, tk, mask,
                             mask_strides, scale, out.data_ptr(), _isa_code(isa), torch.get_num_threads())
    if rc != 0:
        raise MemoryError(f"attend: no scratch memory for {b} x {h} x {tk} scores")
    return out


def _keys_and_mask(k, v, visible, b: int, tq: int):
    """k, v with the head dimension contiguous, their (batch, head, key) strides, and the mask as `_mask`
    gives it, as `bd_attend` takes them."""
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    strides = (ctypes.c_int64 * 6)(*k.stride()[:3], *v.stride()[:3])
    return k, v, strides, *_mask(visible, b, tq, k.shape[2])


def _mask(visible: torch.Tensor | None, b: int, tq: int, tk: int):
    """visible [b or 1, 1, tq, tk] -> its [b, tq, tk] pointer and strides, as the kernels take them
    (None, None where everything is visible). The caller keeps `visible` alive across the call."""
    if visible is None:
        return None, None
    visible = visible.expand(b, 1, tq, tk)[:, 0]                                        # [b, tq, tk] (a view)
    return visible.data_ptr(), (ctypes.c_int64 * 3)(*visible.stride())


class LayerTable(ctypes.Structure):
    """One layer's weight pointers, as `bd_layers` reads them (its LayerPtrs)."""
    _fields_ = [(name, ctypes.c_void_p) for name in ("norm1", "norm2", "q_norm", "k_norm", "qkv", "o", "gate_up",
                                                     "down", "qkv_s", "o_s", "gate_up_s", "down_s")]


@dataclass(frozen=True)
class LayerWeights:
    """A quantized decoder layer as `LayerStack` reads it: plain tensors gathered once by
    `layers/quant.py`, and their pointers (`table`)."""
    norm1: torch.Tensor                   # [H] bf16, before attention
    norm2: torch.Tensor                   # [H] bf16, before the MLP
    eps: float
    qkv: tuple[torch.Tensor, torch.Tensor]          # (packed, scales) [(h + 2 hkv) d, H]
    o: tuple[torch.Tensor, torch.Tensor]            # [H, h d]
    gate_up: tuple[torch.Tensor, torch.Tensor]      # [2 I, H]
    down: tuple[torch.Tensor, torch.Tensor]         # [H, I]
    qk_norms: tuple[torch.Tensor, torch.Tensor] | None   # Qwen3's per-head q and k norm weights [d]
    bits: int
    act_bits: int                         # 16, or 8 (8-bit activations)
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    @functools.cached_property
    def table(self) -> LayerTable:
        qn, kn = self.qk_norms or (None, None)
        tensors = (self.norm1, self.norm2, qn, kn, self.qkv[0], self.o[0], self.gate_up[0], self.down[0],
                   self.qkv[1], self.o[1], self.gate_up[1], self.down[1])
        return LayerTable(*(None if t is None else t.data_ptr() for t in tensors))


class HeadTable(ctypes.Structure):
    """The final norm and LM head as `bd_layers` reads them (its HeadPtrs)."""
    _fields_ = [("norm", ctypes.c_void_p), ("eps", ctypes.c_float), ("w", ctypes.c_void_p), ("s", ctypes.c_void_p),
                ("n", ctypes.c_int), ("bits", ctypes.c_int), ("act_bits", ctypes.c_int), ("normed", ctypes.c_void_p),
                ("logits", ctypes.c_void_p), ("argmax", ctypes.c_void_p)]


@dataclass(frozen=True)
class HeadWeights:
    """A target's final RMSNorm and packed LM head, run by `bd_layers` after the layers where every row's
    logits are wanted (a decoding or verify step): the bits of the norm and head modules over these kernels,
    without a return to Python between. `source`: the (norm, head) modules they came from (`serves` checks
    that the model still holds them, with these tensors)."""
    source: tuple
    weight: torch.Tensor                  # [H] bf16, the norm's
    eps: float
    packed: torch.Tensor
    scales: torch.Tensor
    bits: int
    act_bits: int
    vocab: int

    def serves(self, norm, head) -> bool:
        return (norm is self.source[0] and head is self.source[1] and norm.weight is self.weight
                and head.qweight is self.packed and head.scales is self.scales)


@dataclass
class StackOutput:
    hidden: torch.Tensor                  # [b, t, H] the last layer's output
    taps: list[torch.Tensor]              # [b, t, H] each: the hidden state after each tap layer
    normed: torch.Tensor | None = None    # [b, t, H] after the final norm (with `head`)
    logits: torch.Tensor | None = None    # [b, t, vocab] (with `head`)
    argmax: torch.Tensor | None = None    # [b, t] int64, the logits' argmax as `argmax` gives it (with `head`)
    packed: torch.Tensor | None = None    # [b, t, len(taps) * H] the taps side by side, in their order (run_row)


class LayerStack:
    """A quantized target's decoder layers as `bd_layers` runs them: their weights, and the table of their
    pointers built once; `head` the final norm and LM head where the kernels take them (set by
    `layers/quant.py`)."""

    def __init__(self, layers: list[LayerWeights]):
        self.layers = layers
        self.table = (LayerTable * len(layers))(*(w.table for w in layers))
        self.head: HeadWeights | None = None
        self._rows: dict[int, tuple] = {}   # thread id -> run_row's outputs and head table, made once per head

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv, visible: torch.Tensor | None,
            taps: list[int] = (), isa: str | None = None, head: HeadWeights | None = None) -> StackOutput:
        """x [b, t, H] through every layer in one `bd_layers` call -> the last layer's output and the hidden
        state after each layer in `taps` (and with `head`, every row's final norm and logits), with the bits of
        the layers' PyTorch spelling over these kernels. Each layer writes its new K/V rows and reads its keys
        where `kv` (a step's `KernelKV`) says, visible where `visible` [b or 1, 1, t, keys] says (None: all).
        cos/sin [b, 1, t, d]."""
        self._check_taps(taps)
        b, t, H = x.shape
        d, tk, n = self.layers[0].head_dim, kv.read_slots.shape[1], len(self.layers)
        x = x.contiguous()
        cos, sin = cos.expand(b, 1, t, d).contiguous(), sin.expand(b, 1, t, d).contiguous()
        out = StackOutput(torch.empty_like(x), [torch.empty_like(x) for _ in taps])
        head_table = None
        if head is not None:
            out.normed, out.logits = torch.empty_like(x), torch.empty(b, t, head.vocab, dtype=torch.bfloat16)
            out.argmax = torch.empty(b, t, dtype=torch.int64)
            head_table = self._head_table(head, out)
        mask, mask_strides = _mask(visible, b, t, tk)
        pointers = kv.pointers or [(ctypes.c_void_p * n)(*(bufs[i].data_ptr() for i in range(n)))
                                   for bufs in (kv.k, kv.v)]
        self._call(x.data_ptr(), out, taps, [y.data_ptr() for y in out.taps], b, t, cos.data_ptr(), sin.data_ptr(),
                   pointers, kv.write_slots.data_ptr(),
                   kv.read_slots.data_ptr(), tk, kv.slot_stride, kv.head_stride, mask, mask_strides, head_table, isa)
        return out

    def run_row(self, x: int, cos: int, sin: int, kv, taps: list[int] = ()) -> StackOutput:
        """One decoding row through every layer and the head (`head`, which must be set), from addresses: x the
        row's H bf16 inputs, cos/sin its d bf16 rotary values, `kv` a `RowKV` (its slots as int64 arrays). No
        tensor is made but the taps (`packed`, one tensor): the hidden, normed, logits and argmax outputs are
        this stack's own (one set per calling thread) and the thread's next `run_row` overwrites them."""
        self._check_taps(taps)
        row = self._rows.get(threading.get_ident())
        if row is None or row[0] is not self.head:
            H, bf16 = self.layers[0].norm1.shape[0], torch.bfloat16
            out = StackOutput(torch.empty(1, 1, H, dtype=bf16), [], torch.empty(1, 1, H, dtype=bf16),
                              torch.empty(1, 1, self.head.vocab, dtype=bf16), torch.empty(1, 1, dtype=torch.int64))
            row = self._rows[threading.get_ident()] = (self.head, out, self._head_table(self.head, out))
        _, out, head_table = row
        width = out.hidden.shape[-1]
        packed = torch.empty(1, 1, len(taps) * width, dtype=torch.bfloat16) if taps else None
        self._call(x, out, taps, [packed.data_ptr() + 2 * width * i for i in range(len(taps))], 1, 1, cos, sin,
                   kv.pointers, kv.write, kv.read, kv.keys, kv.slot_stride, kv.head_stride, None, None, head_table,
                   None)
        return StackOutput(out.hidden, [], out.normed, out.logits, out.argmax, packed)

    def _check_taps(self, taps: list[int]) -> None:
        if any(not 0 <= i < len(self.layers) for i in taps):
            raise ValueError(f"tap layers {list(taps)}: the model has layers 0..{len(self.layers) - 1}")

    @staticmethod
    def _head_table(head: HeadWeights, out: StackOutput):
        return ctypes.byref(HeadTable(head.weight.data_ptr(), head.eps, head.packed.data_ptr(), head.scales.data_ptr(),
                                      head.vocab, head.bits, head.act_bits, out.normed.data_ptr(),
                                      out.logits.data_ptr(), out.argmax.data_ptr()))

    def _call(self, x: int, out: StackOutput, taps: list[int], tap_out: list[int], b: int, t: int, cos: int, sin: int,
              pointers, write: int, read: int, tk: int, slot_stride: int, head_stride: int, mask, mask_strides,
              head_table, isa: str | None) -> None:
        w, n = self.layers[0], len(self.layers)
        d = w.head_dim
        rc = library().bd_layers(
            x, out.hidden.data_ptr(), (ctypes.c_int * len(taps))(*taps), (ctypes.c_void_p * len(taps))(*tap_out),
            len(taps), b, t, self.table, n,
            out.hidden.shape[-1], w.heads, w.kv_heads, d, w.intermediate, w.bits, w.act_bits, w.eps, d ** -0.5, cos,
            sin, *pointers, write, read, tk, slot_stride, head_stride, mask, mask_strides, head_table, _isa_code(isa),
            torch.get_num_threads())
        if rc != 0:
            raise MemoryError(f"decoder layers: no scratch memory for {b * t} rows")


def _bf16_inference(*tensors: torch.Tensor) -> bool:
    """Whether the elementwise kernels take these: bf16 on the CPU, no autograd recording through them, a
    built kernel."""
    return (all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in tensors)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) and library() is not None)


def swiglu(gate: torch.Tensor, up: torch.Tensor, isa: str | None = None) -> torch.Tensor | None:
    """`F.silu(gate) * up` for bf16 inference on the CPU (`bd_swiglu`: the same two bf16 roundings, SiLU on
    the kernels' own exp, so the fused layers and this spelling give the same bits), or None where it does not
    apply (another dtype or device, autograd recording, rows not unit-strided, no kernel)."""
    if gate.shape != up.shape or not _bf16_inference(gate, up):
        return None
    i = gate.shape[-1]
    g, u = gate.reshape(-1, i), up.reshape(-1, i)         # views where the rows are evenly spaced
    if g.stride(-1) != 1 or u.stride(-1) != 1:
        return None
    act = torch.empty(g.shape, dtype=torch.bfloat16)
    library().bd_swiglu(g.data_ptr(), g.stride(0), u.data_ptr(), u.stride(0), g.shape[0], i, act.data_ptr(),
                        _isa_code(isa), torch.get_num_threads())
    return act.view(gate.shape)


def _given(*tensors: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    return tuple(t for t in tensors if t is not None)


def _conv_operands(state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[tuple, tuple]:
    """A short conv's state, weight and bias (or None) as its kernels read them: contiguous tensors, which the
    caller keeps alive across the call, and their addresses (None for no bias)."""
    kept = (state.contiguous(), weight.contiguous(), None if bias is None else bias.contiguous())
    return kept, tuple(None if t is None else t.data_ptr() for t in kept)


def short_conv(proj: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               isa: str | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """LFM2's short convolution between its projections for bf16 inference on the CPU (`bd_short_conv`):
    proj [b, t, 3H] (B, C, x), state [b, K-1, H], weight [H, K], bias [H] or None -> (bx = B * x, the rows
    the state keeps; y = C * conv([state; bx]) in bf16), each [b, t, H], with the bits of the PyTorch spelling
    (`models/lfm2.py`); None where it does not apply (another dtype or device, autograd recording, no kernel)."""
    if proj.dim() != 3 or not _bf16_inference(proj, *_given(state, weight, bias)):
        return None
    b, t, width = proj.shape
    h, k = weight.shape
    if width != 3 * h or state.shape != (b, k - 1, h) or proj.stride(-1) != 1 or proj.stride(0) != t * proj.stride(1):
        return None
    _kept, addresses = _conv_operands(state, weight, bias)        # the tensors live until the call returns
    bx, y = torch.empty(b, t, h, dtype=torch.bfloat16), torch.empty(b, t, h, dtype=torch.bfloat16)
    if library().bd_short_conv(proj.data_ptr(), proj.stride(1), addresses[0], b, t, h, k, *addresses[1:],
                               bx.data_ptr(), y.data_ptr(), _isa_code(isa)):
        raise MemoryError(f"short_conv: no scratch memory for a {h} x {k} weight")
    return bx, y


def conv_layer(x: torch.Tensor, norms: tuple[torch.Tensor, torch.Tensor], eps: float, projections: tuple,
               state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               isa: str | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One LFM2 short-convolution layer in one call (`bd_conv_layer`): x [b, t, H] bf16 -> (the layer's output,
    bx [b, t, H]: the rows its conv state keeps), with the bits of `models/lfm2.py`'s ShortConvLayer over these
    kernels. norms: the two RMSNorm weights [H]; projections: the packed in_proj, out_proj, MLP gate-and-up and
    down (`QuantizedLinear`s of one width and activation width, no bias); state [b, K-1, H]; weight [H, K],
    bias [H] or None: the conv's. None where it does not apply (another dtype or device, autograd recording)."""
    if x.dim() != 3 or not _bf16_inference(x, *norms, *_given(state, weight, bias)):
        return None
    b, t, h = x.shape
    k = weight.shape[1]
    in_proj, down = projections[0], projections[-1]
    if state.shape != (b, k - 1, h) or h % 16:
        return None
    out, bx = x.contiguous().clone(), torch.empty(b, t, h, dtype=torch.bfloat16)
    _kept, addresses = _conv_operands(state, weight, bias)        # the tensors live until the call returns
    rc = library().bd_conv_layer(out.data_ptr(), b, t, h, down.in_features, norms[0].data_ptr(), norms[1].data_ptr(),
                                 eps, *(p for m in projections for p in (m.qweight.data_ptr(), m.scales.data_ptr())),
                                 in_proj.bits, in_proj.act_bits, *addresses, k, bx.data_ptr(), _isa_code(isa),
                                 torch.get_num_threads())
    if rc != 0:
        raise MemoryError(f"conv_layer: no scratch memory for {b * t} rows")
    return out, bx


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, isa: str | None = None) -> torch.Tensor | None:
    """RMSNorm of bf16 rows on the CPU (`bd_rmsnorm`), or None where it does not apply (another dtype
    or device, a width not a multiple of 16, autograd recording, no kernel)."""
    d = x.shape[-1]
    if d % 16 or not _bf16_inference(x, weight):
        return None
    x = x.contiguous()
    out = torch.empty_like(x)
    library().bd_rmsnorm(x.data_ptr(), x.numel() // d, d, weight.data_ptr(), eps, out.data_ptr(),
                         _isa_code(isa), torch.get_num_threads())
    return out


def delta_rule(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor,
               beta: torch.Tensor, valid: torch.Tensor | None, keep_states: bool):
    """The Gated DeltaNet recurrence of `layers/deltanet.py` in one call per forward (`bd_delta_rule`, instead
    of a dozen PyTorch ops per row), or None where it does not apply (not fp32 on the CPU, autograd
    recording, no kernel). Its sums are ordered as PyTorch's are not, so it agrees with the PyTorch spelling
    to fp32 rounding; wherever it applies it runs every row (prefill, decode, verify, replay), so a state
    has the same bits however its rows were grouped."""
    tensors = (state, q, k, v, decay, beta)
    if (any(x.dtype != torch.float32 or x.device.type != "cpu" for x in tensors) or library() is None
            or (torch.is_grad_enabled() and any(x.requires_grad for x in tensors))):
        return None
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    state, q, k, v, decay, beta = (x.contiguous() for x in tensors)
    out = torch.empty(b, t, h, dv)
    final = torch.empty(b, h, dk, dv)
    per_row = torch.empty(b, t, h, dk, dv) if keep_states else None
    mask = valid.to(torch.uint8).contiguous() if valid is not None else None
    library().bd_delta_rule(state.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), decay.data_ptr(),
                            beta.data_ptr(), None if mask is None else mask.data_ptr(), b, t, h, dk, dv,
                            out.data_ptr(), final.data_ptr(), None if per_row is None else per_row.data_ptr(),
                            torch.get_num_threads())
    return out, final, per_row


def _markov_operands(embed: torch.Tensor, weight: torch.Tensor):
    """(embed rows [rows, rank], W2 in `markov_blocks`' layout, threads) for the Markov kernels, or None where
    they do not apply: not a bf16 weight on the CPU, autograd recording, no kernel."""
    if (weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or embed.dtype != torch.float32
            or library() is None or (torch.is_grad_enabled() and (weight.requires_grad or embed.requires_grad))):
        return None
    vocab, rank = weight.shape
    blocked = cached_on(weight, "_markov_blocks", None, markov_blocks)         # [V / 128, rank, 128] bf16
    flat = embed.reshape(-1, rank).contiguous()                                 # [rows, rank]
    # a thread per MARKOV_WORK multiply-adds at most: the pruned vocabularies' bias (~1M) is over before a
    # second thread would start, and a thread the machine has lent elsewhere stalls the whole call
    threads = max(1, min(torch.get_num_threads(), flat.shape[0] * vocab * rank // MARKOV_WORK))
    return flat, blocked, threads


def markov_bias(embed: torch.Tensor, weight: torch.Tensor, isa: str | None = None) -> torch.Tensor | None:
    """DSpark's Markov bias W2 · e for inference (`bd_markov_bias`): embed [.., rank] fp32, weight [V, rank]
    bf16 -> [.., V] fp32, each output the fused multiply-adds of its rank terms in order (the same bits on
    every instruction set, row count and thread count), reading W2 once per row as bf16 from a copy in
    blocks of 128 columns cached on the weight (`markov_blocks`; half the bytes of the fp32 weight
    PyTorch's matmul would read). None where it does not apply: not a bf16 weight on the CPU, autograd
    recording, no kernel."""
    if (operands := _markov_operands(embed, weight)) is None:
        return None
    flat, blocked, threads = operands
    vocab, rank = weight.shape
    out = torch.empty(flat.shape[0], vocab)                                     # [rows, V]
    if flat.shape[0]:
        library().bd_markov_bias(flat.data_ptr(), flat.shape[0], rank, blocked.data_ptr(), vocab, out.data_ptr(),
                                 _isa_code(isa), threads)
    return out.view(*embed.shape[:-1], vocab)


def markov_argmax(embed: torch.Tensor, weight: torch.Tensor, logits: torch.Tensor,
                  isa: str | None = None) -> torch.Tensor | None:
    """One greedy step of DSpark's Markov chain in one pass (`bd_markov_argmax`): embed [rows, rank] fp32,
    weight [V, rank] bf16, logits [rows, V] bf16 or fp32 (rows any stride) -> [rows] int64, the index
    `argmax(logits.float() + markov_bias(embed, weight))` gives (the same sums, one fp32 addition, torch's
    argmax rule: the first NaN, else the first largest), without the [rows, V] fp32 rows between (~0.4 ms less
    a slot of a 65,536-id chain on a 2-core AMX Xeon). None where `markov_bias` does not apply or the logits
    are not bf16 or fp32 rows of V on the CPU."""
    if (logits.dim() != 2 or embed.dim() != 2 or logits.shape != (embed.shape[0], weight.shape[0])
            or (rows := _logit_rows(logits)) is None or (operands := _markov_operands(embed, weight)) is None):
        return None
    flat, blocked, threads = operands
    vocab, rank = weight.shape
    out = torch.empty(flat.shape[0], dtype=torch.int64)
    if flat.shape[0] and library().bd_markov_argmax(flat.data_ptr(), flat.shape[0], rank, blocked.data_ptr(), vocab,
                                                    rows.data_ptr(), rows.stride(0),
                                                    int(logits.dtype == torch.bfloat16), out.data_ptr(),
                                                    _isa_code(isa), threads):
        return None
    return out


def _logit_rows(x: torch.Tensor) -> torch.Tensor | None:
    """x [.., n] as the argmax kernels read it ([rows, n], each row unit-strided), or None where they do not
    apply: not bf16 or fp32 logits on the CPU, no values, autograd recording, an ONNX export or a trace, no kernel."""
    if (x.dtype not in (torch.bfloat16, torch.float32) or x.device.type != "cpu" or x.dim() == 0
            or x.shape[-1] == 0 or library() is None or (torch.is_grad_enabled() and x.requires_grad)
            or torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()):
        return None
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def argmax(x: torch.Tensor, isa: str | None = None) -> torch.Tensor | None:
    """`x.argmax(-1)` for bf16 or fp32 logits on the CPU (`bd_argmax`): the first NaN of a row if it has one,
    else the first of its largest values, as torch's; one AVX512 pass over the values, read as they are
    (a verify's 9 x 65,536 bf16 logits: ~0.07 ms, torch's argmax ~0.5). None where it does not apply:
    without AVX512 (unless `isa` names the portable path: tests) torch's is as fast as the portable loop."""
    if (isa is None and best_isa() not in ("avx512vnni", "amx")) or (flat := _logit_rows(x)) is None:
        return None
    out = torch.empty(flat.shape[0], dtype=torch.int64)
    if flat.shape[0]:
        library().bd_argmax(flat.data_ptr(), flat.shape[0], flat.shape[1], flat.stride(0),
                            int(x.dtype == torch.bfloat16), out.data_ptr(), _isa_code(isa))
    return out.view(x.shape[:-1])


MARKOV_BLOCK = 128
MARKOV_WORK = 4 << 20        # multiply-adds per thread of `markov_bias`


def markov_blocks(weight: torch.Tensor) -> torch.Tensor:
    """W2 [V, rank] -> `bd_markov_bias`'s layout: [ceil(V / 128), rank, 128], block b holding columns
    128 b .. 128 b + 127 (zero past V), each block's values contiguous; on 2 MiB pages where it fills them
    (`hugepages`: a greedy chain reads it once per slot)."""
    vocab, rank = weight.shape
    blocks = -(-vocab // MARKOV_BLOCK)
    padded = torch.zeros(blocks * MARKOV_BLOCK, rank, dtype=weight.dtype)
    padded[:vocab] = weight
    return weight_buffer(padded.view(blocks, MARKOV_BLOCK, rank).transpose(1, 2).contiguous())
