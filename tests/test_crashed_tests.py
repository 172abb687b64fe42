"""A test that kills its pytest worker fails the run at once, naming itself (``--max-worker-restart=0`` in
pyproject.toml): pytest-xdist would otherwise start a new worker, hand it the crashed test's file again with
``--dist loadfile``, and after a few crashes leave every worker idle and the run waiting for ever."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import REPO

PLANTED = """
import os, signal

def test_that_crashes():
    os.kill(os.getpid(), signal.SIGSEGV)

def test_after_the_crash():
    pass
"""

OTHER = """
import time

def test_{n}():
    time.sleep(0.5)
"""


def test_a_test_that_kills_its_worker_fails_the_run_naming_it_within_a_minute(tmp_path: Path) -> None:
    (tmp_path / "test_planted.py").write_text(PLANTED)
    for n in range(4):
        (tmp_path / f"test_other_{n}.py").write_text(OTHER.replace("{n}", f"other_{n}"))
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    took = time.monotonic() - started
    assert result.returncode == 1, result.stdout[-3000:]
    assert "crashed while running 'test_planted.py::test_that_crashes'" in result.stdout, result.stdout[-3000:]
    assert "FAILED test_planted.py::test_that_crashes" in result.stdout
    assert "Fatal Python error: Segmentation fault" in result.stdout + result.stderr, "faulthandler's report is kept"
    assert took < 60, f"the run took {took:.0f} s to end"
