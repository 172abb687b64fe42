"""The engines' environments, for real: pip into a venv of its own, a marker that says what is there, one line
when it cannot be done, and commands that refuse a missing engine before anything starts."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from scaletrain.engines.install import engines_folder, install, installed, python_of, require
from scaletrain.engines.registry import ENGINES
from scaletrain.errors import ConfigError, ScaletrainError
from tests.helpers import run_cli


def test_an_install_that_pip_cannot_do_is_one_line_and_leaves_nothing_taken_for_installed(tmp_path: Path) -> None:
    broken = dataclasses.replace(ENGINES["mxnet"], packages=("scaletrain-no-such-package==0.0.1",))
    with pytest.raises(ScaletrainError) as caught:
        install(broken, tmp_path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("could not install scaletrain-no-such-package==0.0.1")
    assert "for the mxnet engine" in message
    assert installed(broken, tmp_path) is None
    with pytest.raises(ConfigError, match="run 'scaletrain engines install mxnet'"):
        require(broken, tmp_path)


def test_a_marker_for_other_versions_is_not_an_install(tmp_path: Path) -> None:
    engine = ENGINES["mxnet"]
    root = tmp_path / "mxnet"
    (root / "bin").mkdir(parents=True)
    python_of(engine, tmp_path).symlink_to(sys.executable)
    marker = {"engine": "mxnet", "packages": ["mxnet==1.8.0"], "version": "1.8.0"}
    (root / "scaletrain-engine.json").write_text(json.dumps(marker))
    assert installed(engine, tmp_path) is None
    (root / "scaletrain-engine.json").write_text(json.dumps({**marker, "packages": list(engine.packages)}))
    assert installed(engine, tmp_path)["version"] == "1.8.0"


def test_the_folder_comes_from_the_environment() -> None:
    assert engines_folder({"SCALETRAIN_ENGINES": "/x/y"}) == Path("/x/y")
    assert engines_folder({}) == Path.home() / ".cache" / "scaletrain" / "engines"


def test_bench_refuses_a_missing_engine_in_one_line_before_any_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_cli(
        "bench", "lenet", "--framework", "scaletrain,tensorflow", "--steps", "4", "--out", str(out),
        env={"SCALETRAIN_ENGINES": str(tmp_path / "none")},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"scaletrain: error: the tensorflow engine is not installed (looked in {tmp_path / 'none' / 'tensorflow'}): "
        "run 'scaletrain engines install tensorflow'"
    ]
    assert not (out / "runs").exists()  # not even scaletrain's own runs started


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--framework", "scaletrain,jax"], "--framework takes scaletrain, tensorflow, mxnet (comma-separated), got"),
        (["--framework", "mxnet", "--wire", "bf16"], "--wire: it sets how scaletrain trains, and mxnet would not"),
        (["--framework", "mxnet", "-o", "dataset=fashion-mnist"], "-o: it sets how scaletrain trains"),
    ],
)
def test_bad_framework_flags_are_one_line_and_exit_2(flags: list[str], said: str, tmp_path: Path) -> None:
    result = run_cli("bench", "lenet", *flags, "--steps", "4", "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert said in line


def test_a_workload_an_engine_lacks_is_named_with_what_it_has(tmp_path: Path) -> None:
    result = run_cli("bench", "squeezenet", "--framework", "mxnet", "--steps", "4", "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    expected = "scaletrain: error: the mxnet engine has no workload 'squeezenet': it trains lenet, ptb-lstm, gpt"
    assert result.stderr.strip() == expected


def test_engines_list_says_what_is_installed(tmp_path: Path) -> None:
    result = run_cli("engines", "list", env={"SCALETRAIN_ENGINES": str(tmp_path)})
    assert result.returncode == 0
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == list(ENGINES)
    assert all("not installed" in line for line in result.stdout.splitlines())
