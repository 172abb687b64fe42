"""A workload from an installed package (tests/extending/example_plugin/): pip installs it into a folder of its own,
and with that folder on the path its entry point (group ``scaletrain.workloads``) is listed by ``scaletrain workloads``,
offered by ``train``, trained by two real worker processes, and made again by ``load_model`` from the run folder; its
plug-in module (group ``scaletrain.plugins``) adds a wire codec and a technique that two workers train with."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import scaletrain
from scaletrain.cli import main
from scaletrain.efficient import TECHNIQUES
from scaletrain.plugins import installed_plugins, installed_workloads
from scaletrain.tensors.codec import CODECS
from scaletrain.workloads import workload_names
from tests.helpers import REPO, run_cli

PACKAGE = Path(__file__).resolve().parent / "example_plugin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder pip installed the example package into (offline, from a copy of its source)."""
    root = tmp_path_factory.mktemp("plugin")
    source, target = root / "source", root / "site-packages"
    shutil.copytree(PACKAGE, source)  # pip builds inside the source folder: a copy keeps the repository clean
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--no-index",
         "--no-build-isolation", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (target / "scaletrain_blobs-0.1.0.dist-info" / "entry_points.txt").exists()
    return target


@pytest.fixture
def on_path(installed: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process sees the installed package, as one started with its folder on PYTHONPATH would."""
    assert "blobs" not in workload_names()  # not before
    monkeypatch.syspath_prepend(str(installed))
    installed_workloads.cache_clear()  # read once per process: this one's path changed
    installed_plugins.cache_clear()
    yield installed
    installed_workloads.cache_clear()
    installed_plugins.cache_clear()
    for name in ("scaletrain_blobs", "scaletrain_blobs.extras"):
        sys.modules.pop(name, None)
    CODECS.pop("blobs-half", None)  # what its plug-in module added to this process's registries
    TECHNIQUES.pop("blobs-rebatch", None)


def test_its_workload_is_listed_and_offered(on_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workloads", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["blobs"]["parameters"] == 8 * 32 + 32 + 32 * 3 + 3 and "lenet" in rows
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    offered = " ".join(capsys.readouterr().out.split())
    assert "resnet34, resnet, resnet20, resnet32, resnet56, gpt, blobs, or module:attribute" in offered, offered


@pytest.mark.multiprocess
def test_two_workers_train_it_and_load_model_makes_it_again(on_path: Path, tmp_path: Path) -> None:
    environment = {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(on_path)])}
    out = tmp_path / "run"
    trained = run_cli(
        "train", "blobs", "-o", "classes=4", "--workers", "2", "--steps", "24", "--threads", "1", "--out", str(out),
        "--progress", "off", "--no-tensorboard", "--timeout", "60", env=environment,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert (summary["workload"], summary["reference"], summary["workers"]) == ("blobs", "blobs", 2)
    assert summary["options"] == {"classes": "4"} and summary["test_accuracy"] > 0.9
    assert len({worker["weights_digest"] for worker in summary["per_worker"]}) == 1
    assert scaletrain.load_model(out)[2].out_features == 4  # the folder alone: name and options from summary.json


def test_what_its_factory_refuses_is_one_line(
    on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "blobs", "-o", "colour=red", "--out", str(tmp_path / "no")]) == 2
    assert capsys.readouterr().err == "scaletrain: error: blobs has no option colour; its one option is classes\n"


@pytest.mark.multiprocess
def test_its_plugin_module_adds_a_codec_and_a_technique_that_two_workers_use(on_path: Path, tmp_path: Path) -> None:
    environment = {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(on_path)])}
    offered = run_cli("train", "--help", env=environment)
    assert "blobs-half" in offered.stdout and "blobs-rebatch" in offered.stdout
    out = tmp_path / "run"
    trained = run_cli(
        "train", "blobs", "--workers", "2", "--epochs", "2", "--batch-size", "32", "--wire", "blobs-half",
        "--technique", "blobs-rebatch", "-T", "batch_size=64", "-T", "epoch=1", "--threads", "1", "--out", str(out),
        "--progress", "off", "--no-tensorboard", "--timeout", "60", env=environment,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert (summary["wire"], summary["workers"]) == ("blobs-half", 2)
    # the technique changed the batch after the first epoch, on both workers
    assert [segment["batch_size"] for segment in summary["batch_schedule"]] == [32, 64]
    assert len({worker["weights_digest"] for worker in summary["per_worker"]}) == 1
    # the same from Python: scaletrain.train loads the installed plug-in module in this process too
    again = scaletrain.train(
        "blobs", workers=1, steps=4, wire="fp32", technique="blobs-rebatch",
        technique_options={"batch_size": "64", "epoch": "1"}, out=tmp_path / "api", progress="off", tensorboard=False,
    )  # fmt: skip
    assert again["steps"] == 4  # "unknown technique" before anything started had it not been loaded
