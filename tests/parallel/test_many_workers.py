"""8 and 16 worker processes under every strategy, on however few cores (issue 24: what breaks only at N > 3).

The network has four tensors (:mod:`tests.jobs.many_workers`), so a sharded server of 8 or 16
owners has owners that own nothing: they must train, reconfigure, checkpoint and resume like the
others. Synchronous runs must end weight for weight where one process ends (``split`` = the same
batch, ``join`` = N× the batch); asynchronous runs must account for every batch, including the
batches of a worker killed mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from tests.helpers import assert_same_weights, one_process_options
from tests.helpers import model_weights as weights
from tests.jobs import many_workers
from tests.jobs.many_workers import SAMPLES, TENSORS, started, tiny_workload

import scaletrain
from scaletrain.parallel.strategies import all_specs

pytestmark = [pytest.mark.multiprocess, pytest.mark.alone]  # 8 to 17 processes on 2 cores within a --timeout of 30 s

COMMON = {"momentum": 0.9, "progress": "off", "tensorboard": False, "threads": 1, "seed": 5, "timeout": 30.0}
SPLIT_BATCH, JOIN_BATCH = 16, 2  # 16 splits evenly over 8 and 16 workers
NARROW = {"technique": "narrow", "technique_options": {"layer": "0", "fraction": "0.5", "epoch": "1"}}


def layout(label: str, workers: int) -> dict:
    strategy, *rest = label.split("-")
    return {
        "workers": workers,
        "strategy": strategy,
        "server": rest[0] if len(rest) == 2 else "central",
        "sync": rest[-1],
    }


def processes(label: str, workers: int) -> int:
    return workers + (label.startswith("ps-central"))  # the central server's process


def train(label: str, workers: int, out: Path, **settings) -> dict:
    """A run of ``label`` with ``workers`` workers; every process must succeed. Returns the summary."""
    codes = many_workers.train(
        processes(label, workers), out=str(out), **layout(label, workers), **{**COMMON, **settings}
    )
    failed = {rank: code for rank, code in codes.items() if code != 0}
    assert not failed, f"ranks {failed} failed\n{many_workers.Run(out, []).logs()}"
    return json.loads((out / "summary.json").read_text())


def one_process(out: Path, batch_size: int, **settings) -> dict[str, torch.Tensor]:
    scaletrain.train(tiny_workload(), out=out, batch_size=batch_size, **{**COMMON, **settings})
    return weights(out)


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, bool], dict[str, torch.Tensor]]:
    """One process at the batches the runs below equal: split's 16, join's 8·2 (also 16) and 16·2; with
    and without the narrowing after epoch 1."""
    root = tmp_path_factory.mktemp("one-process")
    runs = {}
    for batch in {SPLIT_BATCH, 8 * JOIN_BATCH, 16 * JOIN_BATCH}:
        runs[batch, False] = one_process(root / f"batch-{batch}", batch, epochs=1)
    runs[SPLIT_BATCH, True] = one_process(root / "narrowed", SPLIT_BATCH, epochs=2, **NARROW)
    return runs


# every distributed strategy the registry knows, so that a new one is tested here without a new line
SYNCHRONOUS = [spec for spec in all_specs(predicted_only=True) if not spec.endswith("-async")]


@pytest.mark.parametrize("workers", [8, 16])
@pytest.mark.parametrize("label", SYNCHRONOUS)
def test_synchronous_runs_equal_one_process(label: str, workers: int, references: dict, tmp_path: Path) -> None:
    split = label.endswith("split")
    batch = SPLIT_BATCH if split else JOIN_BATCH
    options = one_process_options(label)
    summary = train(label, workers, tmp_path / "run", batch_size=batch, epochs=1, strategy_options=options)
    global_batch = batch if split else workers * batch
    assert summary["steps"] == SAMPLES // global_batch
    assert_same_weights(weights(tmp_path / "run"), references[global_batch, False])
    if "sharded" in label:  # one owner per tensor; the other workers own nothing and wrote no shard
        assert sorted(path.name for path in (tmp_path / "run" / "shards").iterdir()) == [
            f"rank-{rank}.pt" for rank in range(TENSORS)
        ]


def async_batches(workers: int, batches_per_epoch: int, epochs: int) -> dict[int, int]:
    """How many batches each async worker computes: worker i takes batches i·L/N … (i+1)·L/N − 1
    of every epoch of L batches (integer division)."""
    length = batches_per_epoch
    return {i: epochs * ((i + 1) * length // workers - i * length // workers) for i in range(workers)}


@pytest.mark.parametrize(
    ("server", "workers", "batch", "mode"),
    [
        ("central", 8, 8, "share"),
        ("sharded", 8, 8, "share"),
        ("central", 16, 32, "share"),
        ("sharded", 16, 32, "share"),
        ("central", 16, 40, "split"),
        ("sharded", 16, 40, "split"),
    ],
    ids=[
        "central-8",
        "sharded-8",
        "central-16-fewer-batches-than-workers",
        "sharded-16-fewer-batches-than-workers",
        "central-16-split",
        "sharded-16-split",
    ],
)
def test_asynchronous_runs_account_for_every_batch(
    server: str, workers: int, batch: int, mode: str, tmp_path: Path
) -> None:
    """Every update is counted once; under --async-batches split each is a batch of batch // N (40 // 16 = 2)."""
    epochs = 2 if mode == "share" else 1  # split: 128 updates an epoch
    label = f"ps-{server}-async"
    summary = train(label, workers, tmp_path / "run", batch_size=batch, epochs=epochs, async_batches=mode)
    update = batch if mode == "share" else batch // workers
    planned = async_batches(workers, SAMPLES // update, epochs)
    if update * workers > SAMPLES:
        assert 0 in planned.values()  # some workers have no batch in an epoch: they must finish all the same
    first_worker = processes(label, workers) - workers
    done = {worker["rank"] - first_worker: worker["steps"] for worker in summary["per_worker"]}
    assert summary["lost_workers"] == []
    assert done == planned
    assert summary["server_updates"] == summary["steps"] == sum(planned.values()) == epochs * (SAMPLES // update)
    assert (summary["async_batches"], summary["update_batch_size"]) == (mode, update)
    share = update / batch  # each update's rate factor, and the part of a batch of --batch-size it counts for
    assert summary["async_compensation"]["batch_share"] == pytest.approx(share)
    assert all(worker["batch_fraction"] == pytest.approx(share) for worker in summary["per_worker"])


def test_sixteen_workers_reconfigure_like_one_process(references: dict, tmp_path: Path) -> None:
    """Narrowing the first layer after epoch 1 plans ownership again over the new tensors; the
    owners of nothing take part in the shards' gathering."""
    summary = train("ps-sharded-split", 16, tmp_path / "run", batch_size=SPLIT_BATCH, epochs=2, **NARROW)
    assert summary["architecture"] == {"0": {"out": 3}, "2": {"in": 3}}
    assert_same_weights(weights(tmp_path / "run"), references[SPLIT_BATCH, True])


def test_sixteen_sharded_workers_resume_like_one_process(references: dict, tmp_path: Path) -> None:
    """Owners restore their shards; the owners of nothing restore none and take the owners' weights."""
    out = tmp_path / "run"
    stopped = train("ps-sharded-join", 16, out, batch_size=JOIN_BATCH, epochs=1, steps=3)
    assert stopped["steps"] == 3
    resumed = train("ps-sharded-join", 16, out, batch_size=JOIN_BATCH, epochs=1, resume=True)
    assert (resumed["resumed_from_step"], resumed["steps"]) == (3, SAMPLES // (16 * JOIN_BATCH))
    assert_same_weights(weights(out), references[16 * JOIN_BATCH, False])


def test_sixteen_async_workers_lose_one_and_account_for_every_batch(tmp_path: Path) -> None:
    out, victim, workers, epochs = tmp_path / "run", 9, 16, 4
    # --async-batches split (the default): every update a batch of 32 // 16 = 2
    settings = {**COMMON, **layout("ps-central-async", workers), "batch_size": 16 * JOIN_BATCH, "epochs": epochs}
    with started(workers + 1, out=str(out), log_every=1, **settings) as run:
        deadline = time.monotonic() + 60
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and metrics.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(run.pid(victim), signal.SIGKILL)
        codes = run.wait(120)
    assert codes.pop(victim) == -signal.SIGKILL
    assert set(codes.values()) == {0}, run.logs()
    summary = json.loads((out / "summary.json").read_text())
    planned = async_batches(workers, SAMPLES // JOIN_BATCH, epochs)
    [lost] = summary["lost_workers"]
    assert lost["rank"] == victim and lost["reason"].startswith(f"lost the connection to worker rank {victim}")
    survivors = {worker["rank"]: worker["steps"] for worker in summary["per_worker"]}
    assert survivors == {rank: planned[rank - 1] for rank in range(1, workers + 1) if rank != victim}
    # The server applied the survivors' batches and those the victim sent before it died: every batch counted.
    victims_batches = planned[victim - 1] - lost["batches_not_done"]
    assert 0 <= victims_batches < planned[victim - 1]
    assert summary["server_updates"] == summary["steps"] == sum(survivors.values()) + victims_batches
