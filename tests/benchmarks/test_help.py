"""Every benchmark script answers ``--help`` (argparse formats help text with ``%``: a bare ``%`` in a help
string, such as a wire named ``topk 1 %``, made ``--help`` end in a traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tests.helpers import REPO

SCRIPTS = sorted(path for path in (REPO / "benchmarks").glob("*.py") if "def main(" in path.read_text())


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_help_is_printed(script) -> None:
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage:") and "Traceback" not in result.stderr
