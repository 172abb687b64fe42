"""Bounded staleness (``--max-staleness S``, stale synchronous parallel) with real processes: 3 asynchronous
workers of a small LeNet, one of them slowed (:mod:`tests.parallel.faulty_lenet`), under the central and the
sharded server. The staleness the server measured stays within what the bound guarantees,
``(N − 1)(2S + 1)`` updates (:mod:`scaletrain.parallel.strategies.ps.bound`); every global batch is trained once; the
fast workers wait for the slow one, and without a bound nobody waits and the slow one's gradients go staler."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
from tests.helpers import REPO, make_fashion_mnist

import scaletrain
from scaletrain.cli import main
from scaletrain.parallel.strategies.ps.bound import StalenessBound, StalenessTimeout, staleness_guarantee
from scaletrain.parallel.strategies.ps.records import ServerStats

pytestmark = pytest.mark.multiprocess

FAULTY = "tests.parallel.faulty_lenet:FaultyLeNet"
TRAIN, BATCH, WORKERS = 192, 8, 3  # one epoch of 24 global batches, 8 a worker
COMMON = {"epochs": 1, "batch_size": BATCH, "threads": 1, "progress": "off", "tensorboard": False}
SLOW = "2:0.04"  # rank 2 sleeps 40 ms a step: the slowest worker (central: the second, sharded: the third)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("ssp") / "fmnist", train=TRAIN, test=32)


def train_async(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, server: str, **settings: object
) -> tuple[dict, list[dict]]:
    """The summary of 3 async workers with rank 2 slowed, and the batches each process started."""
    samples = tmp_path / "samples"
    samples.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), str(REPO)]))  # the workload's package
    monkeypatch.setenv("SCALETRAIN_TEST_SLOW", SLOW)
    if "SCALETRAIN_TEST_FAULT" not in os.environ:  # with it a victim would first wait for the others' batches
        monkeypatch.setenv("SCALETRAIN_TEST_SAMPLES", str(samples))
    layout = {"workers": WORKERS, "strategy": "ps", "server": server, "sync": "async", "async_batches": "share"}
    summary = scaletrain.train(FAULTY, data_dir=data, out=tmp_path / "run", **layout, **COMMON, **settings)
    records = [json.loads(line) for path in samples.glob("samples-*.jsonl") for line in path.read_text().splitlines()]
    return summary, records


@pytest.mark.parametrize("server", ["central", "sharded"])
@pytest.mark.parametrize("limit", [0, 1])
def test_the_bound_holds_and_the_fast_workers_wait(
    limit: int, server: str, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    summary, records = train_async(data, tmp_path, monkeypatch, server=server, max_staleness=limit)
    steps = TRAIN // BATCH
    assert summary["server_updates"] == summary["steps"] == steps and summary["lost_workers"] == []
    assert sorted(record["number"] for record in records) == list(range(steps))  # every global batch once
    guarantee = staleness_guarantee(limit, WORKERS)
    assert summary["staleness"]["max"] <= guarantee, summary["staleness"]
    wait = summary["staleness_wait"]
    assert summary["max_staleness"] == wait["max_staleness"] == limit and wait["guaranteed_max"] == guarantee
    assert wait["seconds"] > 0 and wait["seconds_per_step"] > 0 and wait["held_steps"] > 0
    slow = wait["by_worker"].pop("2")
    assert min(wait["by_worker"].values()) > slow, summary["staleness_wait"]  # the fast ones waited for it


def test_without_a_bound_nobody_waits(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary, _ = train_async(data, tmp_path, monkeypatch, server="central")
    assert summary["max_staleness"] is None and summary["staleness_wait"] is None
    assert summary["server_updates"] == TRAIN // BATCH
    # the fast workers ran ahead: the slow one's gradients are staler than a bound of 0 would allow
    assert summary["staleness"]["max"] > staleness_guarantee(0, WORKERS), summary["staleness"]


def test_a_lost_worker_does_not_hold_the_others(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 3 dies at its fourth step; the central server counts it lost and the others, held for it at S = 0
    while it lived, go on without it."""
    monkeypatch.setenv("SCALETRAIN_TEST_FAULT", "3:4:SIGKILL")
    summary, _ = train_async(data, tmp_path, monkeypatch, server="central", max_staleness=0)
    [lost] = summary["lost_workers"]
    assert lost["rank"] == 3 and lost["batches_not_done"] > 0
    assert summary["server_updates"] == TRAIN // BATCH - lost["batches_not_done"]
    assert summary["staleness"]["max"] <= staleness_guarantee(0, WORKERS)


def test_a_bounded_run_resumes(data: Path, tmp_path: Path) -> None:
    """Stopped after 5 updates (shares of 1, 2 and 2 batches: the first to finish holds nobody back), then
    resumed: the clocks start again from the checkpoint, every worker at 0."""
    layout = {"workers": WORKERS, "strategy": "ps", "server": "sharded", "sync": "async", "max_staleness": 0,
              "async_batches": "share"}  # fmt: skip
    settings = {**layout, **COMMON, "data_dir": data, "out": tmp_path / "run"}
    first = scaletrain.train("lenet", steps=5, **settings)
    resumed = scaletrain.train("lenet", resume=True, **settings)
    assert first["server_updates"] == 5 and resumed["resumed_from_step"] == 5
    assert resumed["steps"] == resumed["server_updates"] + 5 == TRAIN // BATCH
    assert resumed["staleness"]["max"] <= staleness_guarantee(0, WORKERS)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--workers", "2", "--strategy", "ps"], r"this run's updates are synchronous \(--sync join\)"),
        (["--workers", "2"], r"--max-staleness is an option of --strategy ps; add --strategy ps"),
        (["--workers", "2", "--strategy", "ps", "--sync", "async", "--max-staleness", "-1"], "whole number ≥ 0"),
        (
            ["--workers", "2", "--strategy", "ps-central-async", "--technique", "rebatch", "-T", "batch_size=8"],
            "does not work with",
        ),
    ],
)
def test_refused_in_one_line_before_anything_starts(
    flags: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    flags = flags if "--max-staleness" in flags else [*flags, "--max-staleness", "1"]
    assert main(["train", "lenet", "--out", str(tmp_path / "run"), *flags]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("scaletrain: error: "), error
    assert re.search(says, error), error
    assert not (tmp_path / "run").exists()


def test_a_held_reply_waits_for_the_slowest_push_and_no_longer() -> None:
    stats = ServerStats()
    bound, condition = StalenessBound(1, [1, 2, 3], stats, deadline=5.0), threading.Condition()
    with condition:
        for worker, clock in ((1, 3), (2, 1), (3, 2)):
            bound.pushed(worker, clock)

    def slow_push() -> None:
        time.sleep(0.05)
        with condition:
            bound.pushed(2, 2)
            condition.notify_all()

    pusher = threading.Thread(target=slow_push)
    pusher.start()
    with condition:
        bound.hold(condition, 1, 3)  # 3 − 1 = 2: released by worker 2's second push
    pusher.join()
    assert stats.held == 1 and 0.04 < stats.held_seconds[1] < 5.0
    with condition:
        bound.hold(condition, 3, 2)  # within the bound already: not held
        stats.finished.add(2)  # a worker that finished (or was lost) holds nobody
        bound.hold(condition, 1, 3)
    assert stats.held == 1


def test_a_reply_held_past_the_deadline_names_the_slowest_worker() -> None:
    stats = ServerStats(clocks={1: 4, 2: 1, 3: 4})
    bound, condition = StalenessBound(0, [1, 2, 3], stats, deadline=0.1), threading.Condition()
    with (
        condition,
        pytest.raises(StalenessTimeout, match=r"worker rank 2 made no push past 1 within 0 s while worker rank 1"),
    ):
        bound.hold(condition, 1, 4)
    assert bound.failure is not None and stats.held_seconds[1] >= 0.1
