"""Every benchmark script answers ``--help`` (argparse formats help text with ``%``: a bare ``%`` in a help
string, such as a wire named ``topk 1 %``, made ``--help`` end in a traceback). Each script's ``main`` runs
here in this process, as ``python SCRIPT --help`` would run it, without starting 21 interpreters."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from tests.helpers import REPO

SCRIPTS = sorted(path for path in (REPO / "benchmarks").glob("*.py") if "def main(" in path.read_text())


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_help_is_printed(script: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.syspath_prepend(str(script.parent))  # the scripts import their shared helpers as siblings
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # where its dataclasses look themselves up
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code in (0, None)
    assert capsys.readouterr().out.startswith("usage:")
