"""A strategy of one's own is one module and one registry line (``made_up_strategy.py``: ``allgather``):
trained by real processes, predicted from the terms it declares, offered by the command line and the bench,
labelled and summarised like the built-in ones, with nothing in scaletrain edited for it."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import scaletrain
from scaletrain.errors import ConfigError
from scaletrain.estimate.models import predicted_configurations
from scaletrain.estimate.profile import Profile
from scaletrain.parallel.strategies import STRATEGIES, Layout, all_specs, parse_spec, run_label
from tests.helpers import assert_same_weights, make_fashion_mnist, model_weights, run_cli

MODULE = "tests.extending.made_up_strategy"
ROOT = Path(__file__).resolve().parents[2]
PLUGIN_ENV = {"SCALETRAIN_PLUGINS": MODULE, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
COMMON = {"epochs": 1, "momentum": 0.9, "progress": "off", "tensorboard": False, "threads": 1, "seed": 5}
#: Numbers a profile holds; every one of them enters the prediction.
PROFILE = Profile(
    "made-up",
    32,
    t_grad=0.2,
    t_comm=0.05,
    t_grad_parts={2: 0.11, 3: 0.075},
    t_update=0.004,
    latency=0.001,
    bandwidth=1e8,
    weight_bytes=4_000_000,
)


@pytest.fixture
def allgather(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The plug-in as a user loads it: imported by name here (its registry line runs), named in
    SCALETRAIN_PLUGINS for the processes a run starts; afterwards the registry is as it was."""
    before = dict(STRATEGIES)
    assert "allgather" not in before
    for name, value in PLUGIN_ENV.items():
        monkeypatch.setenv(name, value)
    sys.modules.pop(MODULE, None)
    try:
        module = importlib.import_module(MODULE)
        assert STRATEGIES["allgather"].__class__ is module.AllGather
        yield module
    finally:
        STRATEGIES.clear()
        STRATEGIES.update(before)
        sys.modules.pop(MODULE, None)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("allgather") / "fmnist", train=96, test=32)


@pytest.mark.multiprocess
@pytest.mark.parametrize("sync", ["split", "join"])
def test_two_processes_train_with_it_like_one_process(allgather, sync: str, data: Path, tmp_path: Path) -> None:
    # split: the global batch of 12 = one process's batch of 12; join: 2 workers × 12 = one process's 24.
    batch = 12 if sync == "split" else 24
    scaletrain.train("lenet", data_dir=data, out=tmp_path / "local", batch_size=batch, **COMMON)
    summary = scaletrain.train(
        "lenet", data_dir=data, out=tmp_path / "run", batch_size=12, workers=2, strategy="allgather", sync=sync,
        **COMMON,
    )  # fmt: skip
    assert (summary["strategy"], summary["server"], summary["sync"]) == ("allgather", None, sync)
    assert (summary["strategy_label"], summary["workers"], summary["steps"]) == (f"allgather-{sync}", 2, 96 // batch)
    assert len(summary["per_worker"]) == 2
    assert_same_weights(model_weights(tmp_path / "run"), model_weights(tmp_path / "local"))


def expected_speedups(sync: str, workers: int) -> list[float]:
    """Its declared terms by hand: a step is the gradient (of a whole batch for join, of the N-th part for
    split) + N−1 messages of all the weights (latency + bytes ÷ bandwidth) + the optimizer step; a join
    step trains N batches; speedup against one worker alone, t_grad + t_update per batch."""
    alone = PROFILE.t_grad + PROFILE.t_update
    message = PROFILE.latency + PROFILE.weight_bytes / PROFILE.bandwidth
    speedups = []
    for n in range(1, workers + 1):
        gradient = PROFILE.t_grad if sync == "join" else PROFILE.t_grad_parts.get(n, PROFILE.t_grad / n)
        step = gradient + (n - 1) * message + PROFILE.t_update
        speedups.append((n if sync == "join" else 1) * alone / step)
    return speedups


@pytest.mark.parametrize("sync", ["join", "split"])
def test_the_estimator_predicts_it_from_its_declared_terms(allgather, sync: str) -> None:
    speedups = scaletrain.estimate(profile=PROFILE, strategy=f"allgather-{sync}", model="refined", workers=4)
    assert speedups == pytest.approx(expected_speedups(sync, 4), rel=1e-12)
    # The same with the strategy's name and the thesis's --type, as the thesis's interface asks.
    named = scaletrain.estimate(profile=PROFILE, strategy="allgather", kind=f"sync-{sync}", model="refined", workers=4)
    assert named == speedups
    assert f"allgather-{sync}" in [c.label for c in predicted_configurations()]
    # It names no thesis formula, so the thesis model says so instead of guessing one.
    with pytest.raises(ConfigError, match=f"allgather-{sync} is not modelled by the estimator"):
        scaletrain.estimate(profile=PROFILE, strategy=f"allgather-{sync}", model="thesis", workers=4)


def test_the_command_line_predicts_it_and_offers_it_for_training(allgather, tmp_path: Path) -> None:
    profile = PROFILE.save(tmp_path / "profile.json")
    predicted = run_cli(
        "estimate", "--profile", str(profile), "--model", "refined", "--strategy", "allgather-split",
        "--workers", "4", "--output", "csv", env=PLUGIN_ENV,
    )  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr
    printed = [float(value) for value in predicted.stdout.strip().split(";")]
    assert printed == pytest.approx(expected_speedups("split", 4), rel=1e-8)  # nine significant digits
    trained = run_cli("train", "--help", env=PLUGIN_ENV)
    assert trained.returncode == 0, trained.stderr
    assert "allgather-join" in trained.stdout and "allgather-split" in trained.stdout
    without = run_cli("train", "--help", env={"SCALETRAIN_PLUGINS": ""})
    assert without.returncode == 0 and "allgather" not in without.stdout  # the plug-in, not scaletrain, adds it


def test_the_bench_labels_and_the_launcher_take_it_from_the_registry(allgather) -> None:
    assert [spec for spec in all_specs() if spec.startswith("allgather")] == ["allgather-join", "allgather-split"]
    assert parse_spec("AllGather-Split") == ("allgather", "", "split")
    assert run_label("allgather", "central", "join", 2) == "allgather-join, 2 workers"
    layout = Layout("allgather", 3, sync="split")
    assert (layout.world_size, layout.has_server_process, layout.outlives_lost_workers) == (3, False, False)
    with pytest.raises(ConfigError, match="allgather is synchronous"):
        Layout("allgather", 2, sync="async")
