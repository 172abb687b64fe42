"""Workloads named by import reference, ``module:attribute`` (scaletrain.workloads.reference): a workload of a test
module outside the package (tests/workloads/own_workload.py) trains on two real worker processes from the command line
and from the API, ``load_model`` makes it again from ``summary.json``, and every wrong reference is one line and exit
code 2 before anything starts, wherever a workload is named."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO, run_cli
from tests.workloads import own_workload
from tests.workloads.own_workload import REFERENCE

import scaletrain
from scaletrain.cli import main
from scaletrain.errors import ConfigError
from scaletrain.workloads import create_workload

MODULE = own_workload.__name__
#: The test module's folder must be importable by the processes a run starts, as a user's would be.
ENV = {"PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
QUICK = ("--steps", "24", "--threads", "1", "--progress", "off", "--no-tensorboard", "--timeout", "60")
BROKEN = "raise RuntimeError('the blob server is down,\\n  try later')\n"


@pytest.fixture
def broken_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module that raises while it is imported, on this process's path."""
    (tmp_path / "broken_blobs.py").write_text(BROKEN, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "broken_blobs"


WRONG = [
    (f"{MODULE}:nothing", f"{MODULE} has no attribute 'nothing'; it has blobs, make_workload, needs_two"),
    (f"{MODULE}:NOT_CALLABLE", "NOT_CALLABLE is an int, not a Workload subclass, a function returning a workload"),
    (
        f"{MODULE}:needs_two",
        "needs_two(first, second) needs arguments scaletrain cannot give; a workload factory "
        "takes no arguments, or one: the workload options",
    ),
    (f"{MODULE}:returns_nothing", "returns_nothing() returned None, not a workload; return a scaletrain.Workload"),
    (f"{MODULE}:raises", "raises() raised ValueError: no blobs today; fix raises"),
    (
        "no_such_blobs.tasks:make",
        "there is no module 'no_such_blobs' to import; put the folder that holds it on PYTHONPATH",
    ),
    (f"{MODULE}:make_workload:x", "a reference must look like module:attribute, e.g. my_pkg.tasks:make_workload"),
    (
        "broken_blobs:make",
        "importing broken_blobs failed: RuntimeError: the blob server is down, try later; fix the "
        "module (`python -c 'import broken_blobs'` shows where)",
    ),
]


@pytest.mark.usefixtures("broken_module")
@pytest.mark.parametrize(("reference", "message"), WRONG)
def test_a_wrong_reference_is_one_line_and_exit_2_before_anything_starts(
    reference: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["train", reference, "--workers", "2", "--out", str(out), *QUICK]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error, error
    assert error.startswith(f"scaletrain: error: workload {reference}: ") and message in error, error
    assert not out.exists()
    if reference.endswith(("broken_blobs:make", ":raises")):  # the user's code failed: its traceback in a file
        saved = Path(error.rsplit("(traceback in ", 1)[1].removesuffix(")\n"))
        assert saved.read_text(encoding="utf-8").startswith("Traceback (most recent call last):")
        saved.unlink()
    else:
        assert "(traceback in" not in error
    with pytest.raises(ConfigError, match="^workload "):  # the API says the same
        scaletrain.train(reference, workers=2, out=out)


@pytest.mark.usefixtures("broken_module")
@pytest.mark.parametrize(
    "command",
    [
        ["bench", "broken_blobs:make", "--workers", "1,2", "--steps", "2"],
        ["profile", "broken_blobs:make"],
        ["estimate", "broken_blobs:make", "--workers", "2"],
        ["deploy", "kubernetes", "broken_blobs:make", "--image", "scaletrain:cpu"],
    ],
)
def test_every_command_that_takes_a_workload_checks_the_reference_first(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where a bench or profile would write by default
    assert main(command) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "importing broken_blobs failed: RuntimeError: the blob server" in error, error
    assert {path.name for path in tmp_path.iterdir()} - {"__pycache__"} == {"broken_blobs.py"}


def test_options_reach_the_factory_and_one_that_takes_none_refuses_them() -> None:
    workload = create_workload(REFERENCE, {"hidden": "5"})
    assert workload.build_model()[0].out_features == 5
    assert workload.origin.reference == REFERENCE and workload.origin.options == {"hidden": "5"}
    with pytest.raises(ConfigError, match=r"returns_nothing\(\) takes no options, but got hidden=5; drop the options"):
        create_workload(f"{MODULE}:returns_nothing", {"hidden": "5"})
    with pytest.raises(ConfigError, match="unknown workload 'blobz'; choose one of: lenet, .*, or name your own as"):
        create_workload("blobz")


def test_a_deployment_names_the_reference_for_every_pod() -> None:
    objects = scaletrain.deploy_kubernetes(REFERENCE, image="scaletrain:cpu", workers=2)
    job = next(obj for obj in objects if obj["kind"] == "Job")
    assert job["metadata"]["name"] == "scaletrain-own-workload-make-workload"
    assert REFERENCE in job["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.multiprocess
def test_two_workers_train_it_from_the_command_line_and_load_model_makes_it_again(tmp_path: Path) -> None:
    out = tmp_path / "run"
    trained = run_cli("train", REFERENCE, "--workers", "2", "--out", str(out), *QUICK, env=ENV)
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert (summary["workload"], summary["reference"], summary["workers"]) == ("own-blobs", REFERENCE, 2)
    assert len({worker["weights_digest"] for worker in summary["per_worker"]}) == 1
    model = scaletrain.load_model(out)  # nothing but the folder
    weights = torch.load(out / "model.pt", weights_only=True)
    assert all(torch.equal(model.state_dict()[name], weights[name]) for name in weights)
    inputs, labels = own_workload.blobs(640)
    accuracy = (model(inputs[512:]).argmax(1) == labels[512:]).float().mean().item()
    assert accuracy == pytest.approx(summary["test_accuracy"]) and accuracy > 0.9  # four blobs: chance is 0.25


@pytest.mark.multiprocess
def test_the_api_sends_an_object_it_made_as_its_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    mine = create_workload(REFERENCE, {"hidden": "6"})
    mine.cannot_be_pickled = threading.Lock()  # so it must travel as its reference
    out = tmp_path / "api"
    summary = scaletrain.train(mine, workers=2, steps=24, threads=1, progress="off", tensorboard=False, out=out)
    assert (summary["workers"], summary["reference"], summary["options"]) == (2, REFERENCE, {"hidden": "6"})
    assert scaletrain.load_model(out)[0].out_features == 6
