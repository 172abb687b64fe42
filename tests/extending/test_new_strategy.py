"""A strategy of one's own is one module and one registry line (``made_up_strategy.py``: ``allgather``):
trained by real processes, predicted from the terms it declares, offered by the command line and the bench,
labelled and summarised like the built-in ones, its two options set from the command line, a config file and
the API and judged by the strategy itself, its capability (float32 only) asked by scaletrain, with nothing in
scaletrain edited for it and nothing imported but ``scaletrain.extend``."""

from __future__ import annotations

import ast
import importlib
import json
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


@pytest.mark.multiprocess
def test_its_options_come_from_the_api_the_command_line_and_a_config_file(
    allgather, data: Path, tmp_path: Path
) -> None:
    """Each way of saying them trains two workers that end where one process ends (``chunks`` cuts the same sums
    into more messages), and the summary says the values the strategy read."""
    scaletrain.train("lenet", data_dir=data, out=tmp_path / "local", batch_size=12, **COMMON)
    reference = model_weights(tmp_path / "local")
    two = {"workers": 2, "strategy": "allgather", "sync": "split", "batch_size": 12, **COMMON}
    summary = scaletrain.train("lenet", data_dir=data, out=tmp_path / "api", strategy_options={"chunks": 3}, **two)
    assert summary["strategy_options"] == {"chunks": 3, "combine": "mean"}
    assert_same_weights(model_weights(tmp_path / "api"), reference)
    keyword = scaletrain.train("lenet", data_dir=data, out=tmp_path / "keyword", gather_chunks=2, **two)
    assert keyword["strategy_options"] == {"chunks": 2, "combine": "mean"}

    flags = f"--data-dir {data} --batch-size 12 --epochs 1 --momentum 0.9 --seed 5 --threads 1".split()
    flags += ["--progress", "off", "--no-tensorboard"]
    two_cli = ["lenet", "--workers", "2", "--strategy", "allgather-split", "--gather-chunks", "4", "-S", "combine=mean"]
    cli = run_cli("train", *two_cli, *flags, "--out", str(tmp_path / "cli"), env=PLUGIN_ENV)
    assert cli.returncode == 0, cli.stderr
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["strategy_options"] == {
        "chunks": 4,
        "combine": "mean",
    }
    assert_same_weights(model_weights(tmp_path / "cli"), reference)

    config_file = tmp_path / "run.toml"
    config_file.write_text(
        'workload = "lenet"\nworkers = 2\nstrategy = "allgather"\nsync = "split"\n'
        '[strategy_options]\nchunks = 5\ncombine = "sum"\n'
    )
    toml = run_cli("train", "--config", str(config_file), *flags, "--out", str(tmp_path / "toml"), env=PLUGIN_ENV)
    assert toml.returncode == 0, toml.stderr
    assert json.loads((tmp_path / "toml" / "summary.json").read_text())["strategy_options"] == {
        "chunks": 5,
        "combine": "sum",
    }


def test_its_options_are_in_the_help_and_its_own_check_refuses_a_bad_one(allgather, tmp_path: Path) -> None:
    shown = run_cli("train", "--help", env=PLUGIN_ENV)
    assert shown.returncode == 0, shown.stderr
    assert "--gather-chunks" in shown.stdout and "allgather: chunks, combine" in " ".join(shown.stdout.split())
    bad = ["lenet", "--workers", "2", "--strategy", "allgather", "-S", "chunks=0", "--out", str(tmp_path / "run")]
    refused = run_cli("train", *bad, env=PLUGIN_ENV)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "--strategy allgather: -S chunks must be 1 or more, got 0" in refused.stderr
    assert not (tmp_path / "run").exists()
    cases = [
        ({"strategy_options": {"combine": "max"}}, "option combine must be one of mean, sum, got 'max'"),
        ({"strategy_options": {"chunk": 2}}, "has no option chunk; its options: -S chunks=…, -S combine=…"),
        ({"strategy_options": {"chunks": "two"}}, "option chunks must be a whole number, got 'two'"),
        ({"wire": "bf16"}, "--strategy allgather sends its gradients as fp32 only, not --wire bf16; drop --wire"),
    ]
    for settings, message in cases:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            scaletrain.make_config("lenet", workers=2, strategy="allgather", **settings)
    with pytest.raises(ConfigError, match="--gather-chunks is an option of --strategy allgather; add --strategy"):
        scaletrain.make_config("lenet", workers=2, strategy="allreduce", gather_chunks=2)


def test_the_plugin_imports_nothing_of_scaletrain_but_its_plugin_surface() -> None:
    tree = ast.parse((ROOT / "tests" / "extending" / "made_up_strategy.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {module for module in imported if module and module.startswith("scaletrain")} == {"scaletrain.extend"}
