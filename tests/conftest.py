"""Shared fixtures: the tiny shipped checkpoints (bf16 on disk, fp32 in memory) and golden files."""

import json
import os
from pathlib import Path

import pytest
import torch

import blockdraft
from blockdraft.checkpoints.digest import fixture_digest
from blockdraft.loading import load_drafter, load_target

ASSETS = Path(blockdraft.__file__).parent / "assets" / "tiny"
GOLDENS = Path(__file__).parent / "goldens"
DRAFTER_NAMES = ("dflash", "dflash-sliding", "dflash2", "dspark")

# 2 by default (CI); 1 where another job holds a core (spinning thread pools collapse when oversubscribed)
torch.set_num_threads(int(os.environ.get("BLOCKDRAFT_TEST_THREADS", "2")))


@pytest.fixture(scope="session")
def target():
    return load_target(ASSETS / "target-qwen3")


@pytest.fixture(scope="session")
def drafters(target):
    return {name: load_drafter(ASSETS / name, target) for name in DRAFTER_NAMES}


@pytest.fixture(scope="session")
def hybrid_root(tmp_path_factory) -> Path:
    """Where the tiny Qwen3.5 checkpoints and their trained drafters are written once per session
    (`tests/hybrid_models.py`)."""
    return tmp_path_factory.mktemp("qwen3_5")


def pytest_terminal_summary(terminalreporter):
    """Say so when blockdraft's CPU kernels did not build: their tests were skipped and the quantized
    layers ran unfused. Under CI=true that fails the run (`pytest_sessionfinish`)."""
    from blockdraft.layers import cpu_kernels

    if cpu_kernels.available() and cpu_kernels.best_isa() != "amx":
        terminalreporter.write_line(f"blockdraft's AMX tile paths were not tested: this CPU has none (kernels ran "
                                    f"{cpu_kernels.best_isa()})")
    if not cpu_kernels.available():
        terminalreporter.write_sep("!", "blockdraft's CPU kernels did not build (no working C compiler, or "
                                   "BLOCKDRAFT_NO_CPU_KERNELS): their tests were skipped"
                                   + ("; CI=true: failing the run" if os.environ.get("CI") == "true" else ""),
                                   red=True)


def pytest_sessionfinish(session, exitstatus):
    from blockdraft.layers import cpu_kernels

    if os.environ.get("CI") == "true" and not cpu_kernels.available() and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def load_golden(name: str) -> dict:
    """A golden file, refusing to compare against weights it was not generated from."""
    golden = json.loads((GOLDENS / name).read_text())
    for fixture, digest in golden["digests"].items():
        assert fixture_digest(fixture) == digest, (
            f"{name} was generated from other {fixture} weights; run scripts/goldens/regen.sh")
    return golden


def random_prompts(n: int, seed: int, vocab: int = 124, low: int = 3, high: int = 30) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (n,), generator=g)
    return [torch.randint(0, vocab, (int(k),), generator=g).tolist() for k in lengths]


def runnable_isas() -> list[str]:
    """The CPU kernels' instruction-set paths this machine runs (portable first, its best last)."""
    from blockdraft.layers import cpu_kernels as kernels

    best = kernels.ISAS[kernels.best_isa()]
    return [isa for isa, code in kernels.ISAS.items() if code <= best]


def on_threads(n: int, call):
    """call() with torch's thread count set to n (the kernels take theirs from it), then set back."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(n)
        return call()
    finally:
        torch.set_num_threads(threads)
