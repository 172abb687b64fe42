"""Weight-for-weight equivalences of the strategies (Šlampa 2017 §6.1), with real processes on loopback.

- ``split`` over N workers = ``local`` with the same batch (same sample order);
- ``join`` over N workers with batch b = ``local`` with batch N·b;
- every synchronous strategy reaches the same weights; ``async`` with one worker = ``local``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.helpers import assert_same_weights
from tests.helpers import model_weights as weights

import scaletrain

pytestmark = pytest.mark.multiprocess

COMMON = {"epochs": 1, "momentum": 0.9, "progress": "off", "tensorboard": False, "threads": 1, "seed": 5}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers import make_fashion_mnist

    return make_fashion_mnist(tmp_path_factory.mktemp("equivalence") / "fmnist", train=192, test=32)


@pytest.fixture(scope="module")
def local_runs(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, torch.Tensor]]:
    """Reference single-process runs at batch 12 and 24."""
    runs = {}
    for batch in (12, 24):
        out = tmp_path_factory.mktemp(f"local-{batch}")
        scaletrain.train("lenet", data_dir=data, out=out / "run", batch_size=batch, **COMMON)
        runs[batch] = weights(out / "run")
    return runs


SYNCHRONOUS = [
    ("allreduce", "central", "split"),
    ("allreduce", "central", "join"),
    ("ps", "central", "split"),
    ("ps", "central", "join"),
    ("ps", "sharded", "split"),
    ("ps", "sharded", "join"),
]


@pytest.mark.parametrize(("strategy", "server", "sync"), SYNCHRONOUS)
def test_synchronous_strategies_match_sequential_training(
    strategy: str, server: str, sync: str, data: Path, local_runs: dict, tmp_path: Path
) -> None:
    summary = scaletrain.train(
        "lenet",
        data_dir=data,
        out=tmp_path / "run",
        batch_size=12,
        workers=2,
        strategy=strategy,
        server=server,
        sync=sync,
        # Admission control changes the order of transfers, never the result.
        ps_admission="exclusive" if strategy == "ps" and sync == "join" else "none",
        **COMMON,
    )
    assert (summary["strategy"], summary["workers"], summary["sync"]) == (strategy, 2, sync)
    # split: global batch 12 = local batch 12; join: 2 workers × 12 = local batch 24.
    reference = local_runs[12 if sync == "split" else 24]
    assert summary["steps"] == 192 // (12 if sync == "split" else 24)
    assert_same_weights(weights(tmp_path / "run"), reference)


def test_three_workers_split_a_batch_like_one(data: Path, local_runs: dict, tmp_path: Path) -> None:
    scaletrain.train(
        "lenet",
        data_dir=data,
        out=tmp_path / "run",
        batch_size=12,
        workers=3,
        strategy="ps",
        server="sharded",
        sync="split",
        **COMMON,
    )
    assert_same_weights(weights(tmp_path / "run"), local_runs[12])


def test_async_with_one_worker_is_sequential_training(data: Path, local_runs: dict, tmp_path: Path) -> None:
    summary = scaletrain.train(
        "lenet",
        data_dir=data,
        out=tmp_path / "run",
        batch_size=12,
        workers=1,
        strategy="ps",
        server="central",
        sync="async",
        **COMMON,
    )
    assert summary["staleness"]["max"] == 0  # one worker never sends a stale gradient
    assert_same_weights(weights(tmp_path / "run"), local_runs[12])


#: A tiny PTB LSTM trained by one process and by workers that must end with its weights.
TINY_LSTM = dict(
    batch_size=4,
    epochs=2,
    progress="off",
    tensorboard=False,
    threads=1,
    lr=0.5,
    options={"num_steps": "5", "vocab_size": "100", "hidden_size": "16"},
)


def test_lstm_split_carries_each_workers_rows_like_one_process(tiny_ptb: Path, tmp_path: Path) -> None:
    settings = dict(data_dir=tiny_ptb, **TINY_LSTM)
    scaletrain.train("ptb-lstm", out=tmp_path / "local", **settings)
    for strategy, server in (("allreduce", "central"), ("ps", "central")):
        out = tmp_path / f"{strategy}-{server}"
        scaletrain.train("ptb-lstm", out=out, workers=2, strategy=strategy, server=server, sync="split", **settings)
        assert_same_weights(weights(out), weights(tmp_path / "local"))


def test_lstm_async_carries_the_hidden_state_like_one_process(tiny_ptb: Path, tmp_path: Path) -> None:
    # One asynchronous worker computes every window in order on the newest weights: with its hidden
    # state carried from window to window (and reset at each epoch) it must end where one process ends.
    settings = dict(data_dir=tiny_ptb, **TINY_LSTM)
    scaletrain.train("ptb-lstm", out=tmp_path / "local", **settings)
    out = tmp_path / "async"
    layout = dict(workers=1, strategy="ps", server="central", sync="async")
    summary = scaletrain.train("ptb-lstm", out=out, **layout, **settings)
    assert summary["staleness"]["max"] == 0
    assert_same_weights(weights(out), weights(tmp_path / "local"))
