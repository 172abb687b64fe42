"""``--strategy diloco -S outer_exchange=sharded``: the change since the anchor goes to the sharded parameter
server, whose owners step their shares with the outer optimizer. The averaged change is the all-reduce's, so the
weights must equal the all-reduce variant's: with H = 1 and a plain outer step at rate 1 (≤ 1e-6), and with the
paper's Nesterov outer step, whose momentum each owner keeps for its shard, over outer steps and the last, shorter
round; a resumed run ends as the whole run. Real processes on loopback, LeNet on generated Fashion-MNIST files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.helpers import make_fashion_mnist, run_cli
from tests.helpers import model_weights as weights

import scaletrain
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies.diloco import ASYNC_MOMENTUM

pytestmark = pytest.mark.multiprocess

COMMON = {"epochs": 1, "batch_size": 16, "lr": 0.05, "momentum": 0.9, "seed": 4, "threads": 1}
COMMON |= {"progress": "off", "tensorboard": False, "strategy": "diloco"}
SHARDED = {"outer_exchange": "sharded"}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("diloco-sharded") / "fmnist", train=192, test=32)


@pytest.mark.parametrize(
    ("workers", "sync", "sync_every", "options", "steps", "outer_steps", "tolerance"),
    [
        # local SGD with H = 1: the synchronous step, through either exchange
        (2, "split", 1, {"outer_lr": 1, "outer_momentum": 0}, 12, 12, 1e-6),
        # the paper's outer Nesterov SGD (0.7, 0.9) on 3 owners; 4 steps of 3 × 16: an outer step after 3, one after 4
        (3, "join", 3, {}, 4, 2, 1e-5),
    ],
    ids=["local-sgd-2", "nesterov-3"],
)
def test_the_sharded_server_steps_the_anchor_as_the_all_reduce_does(
    workers: int,
    sync: str,
    sync_every: int,
    options: dict,
    steps: int,
    outer_steps: int,
    tolerance: float,
    data: Path,
    tmp_path: Path,
) -> None:
    settings = {"workers": workers, "sync": sync, "sync_every": sync_every, **COMMON}
    reference = scaletrain.train(
        "lenet", data_dir=data, out=tmp_path / "allreduce", strategy_options=options, **settings
    )
    summary = scaletrain.train(
        "lenet", data_dir=data, out=tmp_path / "sharded", strategy_options=options | SHARDED, **settings
    )
    assert summary["strategy_options"]["outer_exchange"] == "sharded"
    assert reference["strategy_options"]["outer_exchange"] == "allreduce"  # the default
    assert (summary["steps"], summary["outer_steps"]) == (reference["steps"], reference["outer_steps"])
    assert (summary["steps"], summary["outer_steps"]) == (steps, outer_steps)
    expected = weights(tmp_path / "allreduce")
    trained = weights(tmp_path / "sharded")
    for name, tensor in trained.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=tolerance, msg=name)


def test_a_run_stopped_between_outer_steps_resumes_to_the_uninterrupted_weights(data: Path, tmp_path: Path) -> None:
    """The paper's Nesterov outer step on 3 owners, H = 3, 2 epochs of 4 steps (3 × 16 a step): a run cut two inner
    steps past its second outer step resumes with each owner's shard and outer momentum, each worker's own weights
    and inner momentum, and ends where the whole run does (up to the order in which the owners add the changes up,
    which the momentum carries on: measured 3.5e-6 at most; without the owners' state, 1.6e-2)."""
    settings = {"workers": 3, "sync": "join", "sync_every": 3, "strategy_options": SHARDED, **COMMON, "epochs": 2}
    whole = scaletrain.train("lenet", data_dir=data, out=tmp_path / "whole", **settings)
    assert (whole["steps"], whole["outer_steps"]) == (8, 3)
    scaletrain.train("lenet", data_dir=data, out=tmp_path / "cut", steps=5, **settings)
    resumed = scaletrain.train("lenet", data_dir=data, out=tmp_path / "cut", resume=True, **settings)
    assert resumed["resumed_from_step"] == 5 and resumed["outer_steps"] == 3
    expected = weights(tmp_path / "whole")
    for name, tensor in weights(tmp_path / "cut").items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-5, msg=name)


def test_asynchronous_owners_step_with_each_change_as_it_comes_and_record_how_stale_it_was(
    data: Path, tmp_path: Path
) -> None:
    """3 workers, H = 2, 4 steps of 3 × 16 each: every owner applies each worker's change alone (rank 0's owner: 3
    workers' 2 outer steps, 6 updates), and as all start from the same anchor, a change that follows another's update
    was computed on an older anchor: at least one is stale. The run learns: each worker's loss falls."""
    async_options = {"outer_exchange": "sharded-async"}
    settings = {"workers": 3, "sync": "join", "sync_every": 2, "strategy_options": async_options, **COMMON}
    summary = scaletrain.train("lenet", data_dir=data, out=tmp_path / "run", steps=4, **settings)
    assert (summary["steps"], summary["outer_steps"], summary["server_updates"]) == (4, 2, 6)
    staleness = summary["staleness"]
    assert sum(staleness["histogram"].values()) == 6 and staleness["max"] >= 1
    for worker in summary["per_worker"]:
        assert worker["last_step_loss"] < worker["first_step_loss"]
    assert summary["test_loss"] < summary["per_worker"][0]["first_step_loss"]


def test_an_outer_momentum_through_the_asynchronous_owners_is_warned_of_in_one_line(data: Path, tmp_path: Path) -> None:
    """It cost ResNet-20 5 to 11 points (results/slow-links-2026-12-07/); the run goes on."""
    common = ["lenet", "--workers", "2", "--strategy", "diloco", "--sync-every", "2", "--steps", "2", "--threads", "1"]
    common += ["--data-dir", str(data), "-S", "outer_exchange=sharded-async", "--progress", "off"]
    warned = run_cli("train", *common, "--out", str(tmp_path / "warned"))
    assert warned.returncode == 0, warned.stderr[-2000:]
    assert [line for line in warned.stderr.splitlines() if line.startswith("warning:")] == [
        f"warning: {ASYNC_MOMENTUM}"
    ]
    plain = run_cli("train", *common, "-S", "outer_lr=1", "-S", "outer_momentum=0", "--out", str(tmp_path / "plain"))
    assert plain.returncode == 0 and "warning:" not in plain.stderr, plain.stderr[-2000:]


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"min_workers": 1}, "-S outer_exchange=sharded does not work with --min-workers yet"),
        ({"technique": "rebatch", "technique_options": {"batch_size": 8}}, "does not work with --technique yet"),
        ({"wire": "powersgd"}, "--wire powersgd needs -S outer_exchange=allreduce"),
        (
            {"resume": True, "strategy_options": {"outer_exchange": "sharded-async"}},
            "-S outer_exchange=sharded-async does not work with --resume yet",
        ),
    ],
)
def test_what_the_sharded_route_lacks_is_refused_before_anything_starts(
    settings: dict, says: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=says):
        scaletrain.train(
            "lenet", out=tmp_path / "run", workers=2, strategy="diloco", **{"strategy_options": SHARDED, **settings}
        )
    assert not (tmp_path / "run").exists()
