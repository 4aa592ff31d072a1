"""Running generated code (HumanEval completions) in a child process that can only write inside
its own temporary directory, under a wall-clock limit.

The child (`sandbox_child.py`) confines itself before the program runs: Landlock (Linux ≥ 5.13,
unprivileged) denies every filesystem write outside the directory to it and to anything it
spawns; where the kernel has no Landlock, an audit hook refuses writes outside the directory,
process creation and ctypes. CPU time, memory and file size are capped with rlimits. The wall
clock is enforced here: past `timeout_s` the child's whole process group is killed and the
program counts as failed. This module knows nothing about models or tasks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).with_name("sandbox_child.py")


@dataclass(frozen=True)
class RunResult:
    passed: bool
    reason: str          # "passed", "timed out after Ns", "exit code N: <last stderr line>", "sandbox: ..."
    isolation: str       # "landlock" or "audit-hook"


def run_python(source: str, timeout_s: float = 5.0, use_landlock: bool = True) -> RunResult:
    """Run `source` as a Python program in a fresh temporary directory; passed = exit code 0 in time.
    `use_landlock=False` confines the child with the audit hook alone (the fallback, for tests)."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    with tempfile.TemporaryDirectory(prefix="blockdraft-exec-") as tmp:
        program = Path(tmp) / "program.py"
        program.write_text(source)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen([sys.executable, "-I", str(CHILD), tmp, str(program), str(timeout_s),
                                 "landlock" if use_landlock else "audit-hook"], cwd=tmp,
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        timed_out = False
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)          # the child and anything it started
            _, err = proc.communicate()
    lines = err.decode(errors="replace").splitlines()
    isolation = next((line.split(":", 1)[1] for line in lines if line.startswith("blockdraft-sandbox:")), "none")
    rest = [line for line in lines if not line.startswith("blockdraft-sandbox:")]
    if timed_out:
        return RunResult(False, f"timed out after {timeout_s:g}s", isolation)
    if isolation == "none" or isolation.startswith("failed"):
        return RunResult(False, f"sandbox: {isolation}", isolation)
    if proc.returncode == 0:
        return RunResult(True, "passed", isolation)
    return RunResult(False, f"exit code {proc.returncode}: {rest[-1] if rest else ''}"[:300], isolation)
