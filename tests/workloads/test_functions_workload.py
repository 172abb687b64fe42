"""Workloads from plain functions (:func:`scaletrain.from_functions`): a regression and a two-head model, made
by ``module:factory``, on 4 split workers under every strategy equal to one process, saved and rebuilt by
``load_model``; and what is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO, assert_same_weights
from tests.helpers import model_weights as weights

import scaletrain
from scaletrain.errors import ConfigError

COMMON = {"epochs": 1, "progress": "off", "tensorboard": False, "threads": 1, "seed": 3}
FACTORIES = {
    "regression": "tests.workloads.own_functions:regression",
    "two-heads": "tests.workloads.own_functions:two_heads",
}
METRICS = {"regression": "test_loss", "two-heads": "test_accuracy"}


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, Path]]:
    runs = {}
    for name, factory in FACTORIES.items():
        out = tmp_path_factory.mktemp(f"alone-{name}") / "run"
        runs[name] = (scaletrain.train(factory, out=out, **COMMON), out)
    return runs


def test_one_process_trains_reports_the_metric_and_load_model_rebuilds_it(alone: dict) -> None:
    regression, out = alone["regression"]
    workload = scaletrain.create_workload(FACTORIES["regression"])
    torch.manual_seed(COMMON["seed"])
    untrained = workload.evaluate(workload.build_model(), workload.load_data(None))["test_loss"]
    assert regression["metric"] == "test_loss" and regression["test_loss"] < 0.5 * untrained
    two_heads, two_out = alone["two-heads"]
    assert two_heads["metric"] == "test_accuracy" and "test_value_error" in two_heads
    for folder in (out, two_out):
        model = scaletrain.load_model(folder)
        assert_same_weights(weights(folder), {k: v for k, v in model.state_dict().items()})
        assert model(torch.zeros(2, 6)) is not None


@pytest.mark.multiprocess
@pytest.mark.parametrize("spec", ["allreduce-split", "ps-central-split", "ps-sharded-split"])
@pytest.mark.parametrize("name", list(FACTORIES))
def test_four_split_workers_equal_one_process(
    name: str, spec: str, alone: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), str(REPO)]))
    summary = scaletrain.train(FACTORIES[name], out=tmp_path / "run", workers=4, strategy=spec, **COMMON)
    assert summary["metric"] == METRICS[name] and summary["steps"] == alone[name][0]["steps"] == 12
    assert_same_weights(weights(tmp_path / "run"), weights(alone[name][1]))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"train": (torch.zeros(4, 2), torch.zeros(3))}, "tensors with the same number of rows"),
        ({"train": 5}, "a tuple of tensors or a map-style Dataset"),
        ({"metric": "test_r2"}, "metric 'test_r2' comes from an evaluate function"),
    ],
)
def test_bad_arguments_are_one_line(arguments: dict, message: str) -> None:
    given = {"train": (torch.zeros(4, 2),), "test": (torch.zeros(2, 2),), **arguments}
    with pytest.raises(ConfigError, match=message):
        scaletrain.from_functions(lambda: torch.nn.Linear(2, 1), lambda model, batch: model(batch[0]).sum(), **given)


def test_a_loss_that_is_not_a_scalar_is_one_line(tmp_path: Path) -> None:
    workload = scaletrain.from_functions(
        lambda: torch.nn.Linear(2, 1), lambda model, batch: model(batch[0]), train=(torch.zeros(8, 2),),
        test=(torch.zeros(2, 2),), batch_size=4,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="loss must return a scalar tensor"):
        scaletrain.train(workload, out=tmp_path / "run", **COMMON)
