"""The CLI only parses flags and calls the public API (``scaletrain.api``), never another module's privates."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLI = Path(__file__).resolve().parents[2] / "src" / "scaletrain" / "cli"
#: Machinery the CLI reaches through the API (``exit_now``, ``profile(out=…)``, ``estimate(plot=…)``).
THROUGH_THE_API = ("scaletrain.parallel.worker", "scaletrain.train.checkpoint", "scaletrain.estimate.plots")


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda path: path.name)
def test_cli_modules_import_no_private_names_and_no_machinery(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scaletrain"):
            private = [alias.name for alias in node.names if alias.name.startswith("_")]
            assert not private, f"{path.name} imports {private} from {node.module}"
            assert node.module not in THROUGH_THE_API, f"{path.name} imports from {node.module}; use scaletrain.api"
