"""Generated code runs confined: it cannot write outside its temporary directory, and a program
that never ends is stopped and scored as failed."""

import time

import pytest

from blockdraft.evaluation.sandbox import run_python

ESCAPE = """
import os, time
for path in {paths!r}:
    try:
        with open(path, "w") as f:
            f.write("escaped")
    except OSError:
        pass
try:
    os.mkdir({outside_dir!r})
except OSError:
    pass
open("inside.txt", "w").write("allowed")         # its own directory is writable
assert open("inside.txt").read() == "allowed"
time.sleep(10**6)
"""


@pytest.mark.parametrize("use_landlock", [True, False], ids=["landlock", "audit-hook"])
def test_code_that_writes_outside_and_sleeps_is_stopped_and_fails(tmp_path, use_landlock):
    victims = [tmp_path / "outside.txt", tmp_path / "deep" / ".." / "outside2.txt"]
    source = ESCAPE.format(paths=[str(p) for p in victims], outside_dir=str(tmp_path / "made_dir"))
    started = time.perf_counter()
    result = run_python(source, timeout_s=1.0, use_landlock=use_landlock)
    assert time.perf_counter() - started < 5
    assert not result.passed and result.reason == "timed out after 1s"
    assert result.isolation == ("landlock" if use_landlock else "audit-hook")
    assert list(tmp_path.iterdir()) == []                       # nothing was written


@pytest.mark.parametrize("use_landlock", [True, False], ids=["landlock", "audit-hook"])
def test_outside_write_is_refused_and_a_correct_program_passes(tmp_path, use_landlock):
    outside = tmp_path / "x.txt"
    refused = run_python(f"open({str(outside)!r}, 'w').write('x')\n", 5.0, use_landlock)
    assert not refused.passed and "PermissionError" in refused.reason and not outside.exists()
    spawn = run_python(f"import subprocess\nsubprocess.run(['sh', '-c', 'echo x > {outside}'], check=True)\n",
                       5.0, use_landlock)
    assert not spawn.passed and not outside.exists()
    assert run_python("assert sum(range(10)) == 45\n", 5.0, use_landlock).passed
    assert "AssertionError" in run_python("assert 1 == 2\n", 5.0, use_landlock).reason
