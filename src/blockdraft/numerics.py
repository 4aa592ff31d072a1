"""Which numerics to run in, and what the machine offers.

`--dtype auto` (the default): bf16 for the default model and for any checkpoint stored in bf16
(most published ones) — their own precision, and the dtype whose kernels `layers/linear.py`
and `layers/attention.py` make row-invariant on the CPU, so speculative greedy output equals
plain greedy output bit for bit. fp32 on MKL is not row-invariant (its one-row GEMV and
multi-row GEMM round differently), so fp32 speculation is lossless only up to fp32 rounding at
near-ties; `auto` keeps it only for a checkpoint stored in fp32 or fp16 on the CPU (bf16 would
round its weights into another model). CUDA runs bf16 (not row-invariant there: `describe`).

CPUs with AVX512-BF16 or AMX run multi-row bf16 matmuls natively (a 9-row verify costs about
a 1-row step); on AVX2-only CPUs they are emulated and cost grows with the row count. Either
way the draft-width policy (`engine/policy.py`) measures it and verifies only as many drafts as
pay, down to none.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from .errors import ConfigError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """A dtype name (or dtype) -> torch.dtype; an unknown name is a named error."""
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ConfigError(f"dtype {name!r} is not supported (choose from {sorted(DTYPES)})")
    return DTYPES[name]


def _cpuinfo(field: str) -> str | None:
    """The value of the first `field` line of Linux /proc/cpuinfo (None elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    return frozenset((_cpuinfo("flags") or "").split())


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo; else what `platform` reports)."""
    import platform

    return _cpuinfo("model name") or platform.processor()


def native_bf16(flags: frozenset[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def resolve_device(requested: str | None) -> str:
    """`cpu`, `cuda` or `cuda:N` -> a validated torch device string (default cpu); a device that is not
    there is a named error before anything loads."""
    name = (requested or "cpu").strip()
    if name == "cpu":
        return name
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: no CUDA device is visible (torch.cuda.is_available() is False)")
        index = int(name[5:]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible")
        return name
    raise ConfigError(f"--device {name!r} is not a device (choose cpu, cuda or cuda:N)")


def resolve_dtype(requested: str | None, device: str = "cpu", default_model: bool = False,
                  stored: str | None = None) -> str:
    """`auto`/None -> the dtype to load in (`stored`: the checkpoint's own weight dtype); explicit names
    pass through (validated)."""
    if requested not in (None, "auto"):
        torch_dtype(requested)                  # validated here, before anything loads
        return requested
    if default_model or str(device).startswith("cuda") or stored == "bfloat16":
        return "bfloat16"
    return "float32"


def resolve_quantization(requested: str | None, device: str = "cpu", default_model: bool = False,
                         tensor_parallel: bool = False, dtype: str | torch.dtype | None = "bfloat16") -> str:
    """`auto`/None -> the weight-only scheme to load with; explicit names pass through (validated by
    `layers.quant.check_scheme`).

    auto: the default model ships as a Q4_1 GGUF, and on a CPU with blockdraft's own kernel
    (`layers/cpu_kernels.py`, built with the system C compiler) it runs at that precision — int4,
    bf16 activations carried at 16 bits, as close to the fp32 model as bf16 is (`docs/numerics.md`
    has the fidelity figures). Without the kernel it stays bf16: PyTorch's int4 kernel keeps its
    scales in bf16 and drifts further. Every other case: none."""
    if requested not in (None, "auto"):
        return requested
    if default_model and str(device).startswith("cpu") and not tensor_parallel \
            and (dtype in (None, "auto") or torch_dtype(dtype) == torch.bfloat16):
        from .layers import cpu_kernels

        return "int4" if cpu_kernels.available() else "none"
    return "none"


def describe(dtype: str | torch.dtype, quantization: str = "none", kernel: str | None = None,
             device: str = "cpu") -> dict:
    """What `--json` reports about the numerics in use (`kernel`: what runs the quantized layers).
    `row_invariant`: each row rounds as it would alone, so speculation is bit-exact against plain
    decoding — true only for bf16 on the CPU (`layers/linear.py`, `layers/attention.py`); CUDA's
    kernels are picked by shape and fp32 on MKL rounds a GEMV and a GEMM differently."""
    dt = torch_dtype(dtype)
    out = {"dtype": str(dt).removeprefix("torch."), "quantization": quantization, "device": str(device),
           "cpu_native_bf16": native_bf16(),
           "row_invariant": dt == torch.bfloat16 and str(device).startswith("cpu")}
    return out if kernel is None else {**out, "kernel": kernel}
