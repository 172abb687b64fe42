"""``--resume`` for every strategy: a run stopped part-way continues from its checkpoint; synchronous
runs end with the weights of an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.helpers import make_fashion_mnist, run_cli

import scaletrain

pytestmark = pytest.mark.multiprocess

SETTINGS = {
    "batch_size": 12,
    "epochs": 2,
    "momentum": 0.9,
    "threads": 1,
    "progress": "off",
    "tensorboard": False,
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("resume") / "fmnist", train=192, test=32)


@pytest.mark.parametrize(
    ("strategy", "server", "sync"),
    [
        ("allreduce", "central", "join"),
        ("ps", "central", "split"),
        ("ps", "sharded", "split"),
        ("ps", "sharded", "join"),
    ],
)
def test_synchronous_resume_matches_an_uninterrupted_run(
    strategy: str, server: str, sync: str, data: Path, tmp_path: Path
) -> None:
    layout = {"workers": 2, "strategy": strategy, "server": server, "sync": sync, "data_dir": data}
    straight = scaletrain.train("lenet", out=tmp_path / "straight", **layout, **SETTINGS)
    stopped = scaletrain.train("lenet", out=tmp_path / "split", steps=5, **layout, **SETTINGS)
    assert stopped["steps"] == 5
    resumed = scaletrain.train("lenet", out=tmp_path / "split", resume=True, **layout, **SETTINGS)
    assert resumed["resumed_from_step"] == 5 and resumed["steps"] == straight["steps"]
    first = torch.load(tmp_path / "straight/model.pt", weights_only=True)
    second = torch.load(tmp_path / "split/model.pt", weights_only=True)
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("mode", "update"), [("split", 6), ("share", 12)])
def test_async_resume_finishes_the_remaining_updates(mode: str, update: int, data: Path, tmp_path: Path) -> None:
    """Split: updates of 12 // 2 = 6, so twice as many; the resumed run keeps the checkpoint's schedule."""
    layout = {"workers": 2, "strategy": "ps", "sync": "async", "data_dir": data, "async_batches": mode}
    scaletrain.train("lenet", out=tmp_path / "run", steps=5, **layout, **SETTINGS)
    resumed = scaletrain.train("lenet", out=tmp_path / "run", resume=True, **layout, **SETTINGS)
    assert resumed["resumed_from_step"] == 5 and resumed["update_batch_size"] == update
    assert resumed["steps"] == resumed["server_updates"] + 5 == 2 * (192 // update)


def test_resume_with_another_strategy_is_refused_in_one_true_line(data: Path, tmp_path: Path) -> None:
    scaletrain.train("lenet", out=tmp_path / "run", steps=3, workers=2, data_dir=data, **SETTINGS)
    flags = ["--batch-size", "12", "--epochs", "2", "--momentum", "0.9", "--threads", "1", "--progress", "off"]
    result = run_cli(
        "train", "lenet", "--out", str(tmp_path / "run"), "--resume", "--workers", "2", "--strategy", "ps",
        "--data-dir", str(data), "--no-tensorboard", *flags, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr  # said once, by the launcher, naming the process
    assert "strategy allreduce-join, 2 workers but this run asks for ps-central-join, 2 workers" in lines[0]
    assert "allreduce/central" not in lines[0] and "Traceback" not in result.stderr
