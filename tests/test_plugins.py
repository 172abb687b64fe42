"""SCALETRAIN_PLUGINS: the modules it names are imported by the command; a bad name is one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaletrain.errors import ConfigError
from scaletrain.plugins import load_plugins
from tests.helpers import run_cli


def test_a_plugin_that_cannot_be_imported_is_one_line_and_exit_2() -> None:
    result = run_cli("workloads", env={"SCALETRAIN_PLUGINS": "no_such_plugin_module"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "scaletrain: error: SCALETRAIN_PLUGINS names 'no_such_plugin_module', which cannot be imported "
        "(No module named 'no_such_plugin_module'); put its folder on PYTHONPATH or take it out of SCALETRAIN_PLUGINS"
    ]
    assert "Traceback" not in result.stderr


def test_the_command_sees_what_a_plugin_registers(tmp_path: Path) -> None:
    (tmp_path / "my_workloads.py").write_text(
        "from scaletrain.workloads import WORKLOADS\n"
        "from scaletrain.workloads.lenet import LeNetWorkload\n\n\n"
        "class Mine(LeNetWorkload):\n"
        "    name = 'my-lenet'\n\n\n"
        "WORKLOADS[Mine.name] = Mine\n",
        encoding="utf-8",
    )
    src = Path(__file__).resolve().parents[1] / "src"
    env = {"SCALETRAIN_PLUGINS": "my_workloads", "PYTHONPATH": f"{src}:{tmp_path}"}
    listed = run_cli("workloads", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "my-lenet" in listed.stdout
    assert "my-lenet" not in run_cli("workloads").stdout


def test_load_plugins_reads_a_comma_separated_list() -> None:
    assert load_plugins({"SCALETRAIN_PLUGINS": "json, ,os"}) == ["json", "os"]
    assert load_plugins({}) == []
    with pytest.raises(ConfigError, match="take it out of SCALETRAIN_PLUGINS"):
        load_plugins({"SCALETRAIN_PLUGINS": "json,no_such_plugin_module"})
