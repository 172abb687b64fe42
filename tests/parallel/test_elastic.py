"""Elastic all-reduce (``--min-workers``): a worker killed (SIGKILL) or frozen (SIGSTOP) in the middle of an
epoch, and the survivors finish the run; below the minimum the run stops as without the option.

The fault comes from inside the victim at a chosen step (:mod:`tests.parallel.faulty_lenet`), so the tests
wait for nothing and the step is known. A ``split`` run keeps its global batches, so its final weights must
equal one process's at the same batch, and so must a ``join`` run's, which keeps its global batch of N·b
(``assert_same_weights``: rtol 1e-4, atol 1e-5, the tolerance of every
equivalence test: the survivors sum the gradients in another order)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.helpers import REPO, assert_same_weights, make_fashion_mnist, model_weights, run_cli

import scaletrain
from scaletrain.data.sampler import epoch_permutation
from scaletrain.errors import ConfigError
from scaletrain.parallel.launch import RunFailed

pytestmark = pytest.mark.multiprocess

FAULTY = "tests.parallel.faulty_lenet:FaultyLeNet"
TRAIN, BATCH, STEP = 144, 12, 5  # one epoch of 12 steps; the fault at the forward pass of step 5
COMMON = {"epochs": 1, "momentum": 0.9, "threads": 1, "seed": 5}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("elastic") / "fmnist", train=TRAIN, test=32)


@pytest.fixture(scope="module")
def one_process(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("one") / "run"
    scaletrain.train("lenet", data_dir=data, out=out, batch_size=BATCH, progress="off", tensorboard=False, **COMMON)
    return model_weights(out)


def train_with_fault(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, **settings: object
) -> tuple[dict, Path]:
    """Train FaultyLeNet with three workers started here (all-reduce unless ``settings`` say otherwise); the
    victim faults as ``fault`` says."""
    samples = tmp_path / "samples"
    samples.mkdir()
    # The launcher's processes import the workload from the tests package.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), str(REPO)]))
    monkeypatch.setenv("SCALETRAIN_TEST_FAULT", fault)
    monkeypatch.setenv("SCALETRAIN_TEST_SAMPLES", str(samples))
    summary = scaletrain.train(
        FAULTY,
        data_dir=data,
        out=tmp_path / "run",
        workers=3,
        progress="plain",
        log_every=4,
        tensorboard=False,
        **COMMON,
        **{"batch_size": BATCH, "strategy": "allreduce", **settings},
    )
    return summary, samples


def assert_every_sample_once(samples: Path, change: dict) -> None:
    """The parts the processes computed: before the change three per global batch, from the redone batch on
    two; together every sample of the epoch (less the last incomplete batch) exactly once."""
    records = [json.loads(line) for path in samples.glob("samples-*.jsonl") for line in path.read_text().splitlines()]
    # the step in flight was started by three and not applied (steps_redone 1): the two did it again
    counted = [r for r in records if r["count"] == (3 if r["number"] < change["batch"] else 2)]
    seen = sorted(index for record in counted for index in record["indices"])
    assert seen == sorted(epoch_permutation(TRAIN, seed=5, epoch=0)[: TRAIN // BATCH * BATCH].tolist())


ALLREDUCE = {"strategy": "allreduce"}
CENTRAL = {"strategy": "ps", "server": "central"}


@pytest.mark.parametrize(
    ("layout", "signal", "why", "sync", "batch_size"),
    [
        (ALLREDUCE, "SIGKILL", "died", "split", BATCH),
        (ALLREDUCE, "SIGSTOP", "stopped answering", "split", BATCH),
        # join keeps its global batch of 3 × 4 = the one process's 12, the survivors computing 6 rows each
        (ALLREDUCE, "SIGKILL", "died", "join", BATCH // 3),
        (CENTRAL, "SIGKILL", "died", "join", BATCH // 3),
        (CENTRAL, "SIGSTOP", "stopped answering", "split", BATCH),
    ],
    ids=lambda value: value.get("server", value["strategy"]) if isinstance(value, dict) else None,
)
def test_run_goes_on_without_a_lost_worker(
    layout: dict,
    signal: str,
    why: str,
    sync: str,
    batch_size: int,
    data: Path,
    one_process: dict,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture,
) -> None:
    # a frozen worker is dropped once its heartbeat stood still (1.5 s), not after --timeout: a long one shows it
    timeout = 20 if signal == "SIGSTOP" else 5
    first = 1 if layout["strategy"] == "ps" else 0  # rank 0 of the central server's run is the server
    victim, survivors = first + 2, [first, first + 1]
    settings = {**layout, "sync": sync, "batch_size": batch_size, "min_workers": 2, "timeout": timeout}
    summary, samples = train_with_fault(data, tmp_path, monkeypatch, f"{victim}:{STEP}:{signal}", **settings)
    assert (summary["sync"], summary["batch_size"]) == (sync, batch_size)
    [change] = summary["membership"]
    assert change["left"] == [{"rank": victim, "why": why}]
    assert (change["workers"], change["members"], change["step"], change["steps_redone"]) == (2, survivors, STEP - 1, 1)
    assert summary["steps"] == TRAIN // BATCH
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in records if r.get("kind") == "membership"] == [{"kind": "membership", **change}]
    assert f"step {STEP}: worker rank {victim} ({why}) left; going on with 2 workers" in capfd.readouterr().err
    recovered = change["recovered"] - float((samples / "fault-time").read_text())
    print(f"{signal}: {recovered:.2f} s from the fault to the next completed step")
    assert recovered < 10  # within --timeout for a frozen worker: its silent heartbeat, not the timeout, dropped it
    assert_every_sample_once(samples, change)
    assert_same_weights(model_weights(tmp_path / "run"), one_process)


def test_below_min_workers_the_run_stops_as_without_the_option(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RunFailed) as failed:
        train_with_fault(data, tmp_path, monkeypatch, f"2:{STEP}:SIGKILL", sync="split", min_workers=3)
    message = str(failed.value)
    assert (
        "worker rank 2" in message and "was killed by signal 9" in message and "stopped the other processes" in message
    )
    assert "\n" not in message
    assert not (tmp_path / "run" / "summary.json").exists()


def test_losing_rank_0_stops_the_run_with_one_true_line(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(RunFailed) as failed:
        train_with_fault(data, tmp_path, monkeypatch, f"0:{STEP}:SIGKILL", sync="split", min_workers=2)
    message = str(failed.value)
    assert "worker rank 0" in message and "was killed by signal 9" in message
    assert "not without rank 0: it hosts the store" in message and "\n" not in message


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"min_workers": 0}, "min_workers must be a whole number from 1 to the 3 workers"),
        ({"min_workers": 4}, "min_workers must be a whole number from 1 to the 3 workers"),
        ({"min_workers": 2, "strategy": "ps", "server": "sharded"}, "--min-workers is supported with --strategy"),
        ({"min_workers": 2, "strategy": "ps", "sync": "async"}, "an asynchronous central server goes on without"),
        ({"min_workers": 2, "batch_size": 5, "sync": "join"}, "global batch of 15 must divide evenly"),
    ],
)
def test_bad_min_workers_is_refused_before_anything_starts(settings: dict, says: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=says):
        scaletrain.train("lenet", out=tmp_path / "run", workers=3, **{"batch_size": 12, **settings})
    assert not (tmp_path / "run").exists()


def test_bad_min_workers_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("min_workers = 2\n")  # the config file's key
    run = run_cli(
        "train", "lenet", "--workers", "2", "--strategy", "ps", "--server", "sharded", "--config", str(config),
        "--out", str(tmp_path / "r"),
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "scaletrain: error: --min-workers is supported with --strategy allreduce and the central parameter server "
        "(--sync join or split) only for now, not ps-sharded-join; drop --min-workers (a lost worker then stops the "
        "run, continue with --resume; an asynchronous central server goes on without lost workers by itself)"
    ]


def test_a_worker_lost_while_buffers_are_handed_over_is_a_lost_peer() -> None:
    """Before a checkpoint step the workers hand over module buffers through the store, not a collective: a
    worker lost there is a lost peer too (in an elastic run), heard of from another survivor or timed out."""
    import torch.distributed as dist
    from torch import nn

    from scaletrain.parallel.agreement import StoreAgreement
    from scaletrain.train.exchange import PeerLost

    store, flag = dist.HashStore(), []
    agreement = StoreAgreement(store, deciding=True, timeout=0.2, rank=0, workers=(0, 1), lost=lambda: bool(flag))
    with pytest.raises(PeerLost) as lost:
        agreement.buffers_due(3, nn.BatchNorm1d(2))
    assert lost.value.why == "did not hand over its module buffers in time"
    flag.append(True)
    with pytest.raises(PeerLost) as lost:
        agreement.buffers_due(4, nn.BatchNorm1d(2))
    assert lost.value.why is None  # only heard of it: the survivor that saw it says why
